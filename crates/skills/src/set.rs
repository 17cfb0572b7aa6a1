//! The skill set a replica serves: its skills by URI, its files by URI, the directory tree they make, and the
//! set's digest. Built once; every answer is read from it.

use crate::skill::{File, digest};
use crate::{DIRECTORY, SCHEME, SKILL_MD, Skill, SkillError};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

/// The default number of entries in one page of `skills/list` or `resources/directory/read`.
pub const DEFAULT_PAGE_SIZE: usize = 50;

/// One page of a paginated answer.
#[derive(Debug)]
pub struct Page {
    pub items: Vec<Value>,
    /// The cursor of the next page, if there is one.
    pub next_cursor: Option<String>,
}

/// The skills a server serves, immutable. Every replica that loads the same skills holds the same bytes, digests
/// and [`digest`](Self::digest).
#[derive(Debug)]
pub struct Skills {
    skills: BTreeMap<String, Arc<Skill>>,
    files: HashMap<String, Arc<File>>,
    /// Each directory's direct children (URI → its `Resource`), every directory level of every skill path.
    dirs: BTreeMap<String, BTreeMap<String, Value>>,
    digest: String,
    page_size: usize,
}

impl Default for Skills {
    fn default() -> Self {
        Self::empty()
    }
}

impl Skills {
    /// No skills: the extension is not declared.
    #[must_use]
    pub fn empty() -> Self {
        Self {
            skills: BTreeMap::new(),
            files: HashMap::new(),
            dirs: BTreeMap::new(),
            digest: digest(b""),
            page_size: DEFAULT_PAGE_SIZE,
        }
    }

    /// The set of `skills`.
    ///
    /// # Errors
    /// [`SkillError::Duplicate`] when two skills have one URI, or two skills list one file URI with other bytes.
    pub fn new(skills: impl IntoIterator<Item = Skill>) -> Result<Self, SkillError> {
        let mut set = Self::empty();
        for s in skills {
            let uri = s.uri().to_owned();
            for f in &s.files {
                match set.files.get(&f.uri) {
                    Some(seen) if seen.digest != f.digest => return Err(SkillError::Duplicate(f.uri.clone())),
                    Some(_) => {}
                    None => {
                        set.files.insert(f.uri.clone(), Arc::clone(f));
                    }
                }
            }
            if set.skills.insert(uri.clone(), Arc::new(s)).is_some() {
                return Err(SkillError::Duplicate(uri));
            }
        }
        set.dirs = tree(set.files.values());
        set.digest = set_digest(&set.skills);
        Ok(set)
    }

    /// Every skill under `root`: each directory below it with a `SKILL.md` is one, served at
    /// `skill://<its path from root>/`. A skill inside another is a skill of its own, and its files are also the
    /// enclosing skill's.
    ///
    /// # Errors
    /// [`SkillError::Read`] when `root` cannot be read, is itself a skill, or holds none;
    /// [`SkillError::Invalid`] for a skill that breaks a rule ([`Skill::new`]).
    pub fn load_dir(root: &Path) -> Result<Vec<Skill>, SkillError> {
        let read = |why: String| SkillError::Read { path: root.display().to_string(), why };
        if root.join(SKILL_MD).is_file() {
            return Err(read(format!(
                "it has a {SKILL_MD} of its own; each skill is a directory below it, named after the skill"
            )));
        }
        let mut dirs = Vec::new();
        skill_dirs(root, "", &mut dirs).map_err(|e| read(e.to_string()))?;
        if dirs.is_empty() {
            return Err(read(format!("no directory below it has a {SKILL_MD}")));
        }
        dirs.into_iter().map(|rel| Skill::from_dir(&root.join(&rel), &rel)).collect()
    }

    /// The same set, answering `skills/list` and `resources/directory/read` `n` entries a page (at least 1).
    #[must_use]
    pub fn with_page_size(mut self, n: usize) -> Self {
        self.page_size = n.max(1);
        self
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// How many skills.
    #[must_use]
    pub fn len(&self) -> usize {
        self.skills.len()
    }

    /// The skills, in URI order.
    pub fn iter(&self) -> impl Iterator<Item = &Skill> {
        self.skills.values().map(AsRef::as_ref)
    }

    /// The set's digest: `sha256:` over each skill's URI and each of its files' URI and digest, in order. Two
    /// replicas serve the same skills, bytes and all, exactly when their digests are equal.
    #[must_use]
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The extension's settings for `capabilities.extensions`, or `None` when there are no skills (the extension
    /// is not declared then).
    #[must_use]
    pub fn capability(&self) -> Option<Value> {
        (!self.is_empty()).then(|| json!({ "directoryRead": true }))
    }

    /// A page of `skills/list`, after `cursor`. A skill's entry is never split.
    ///
    /// # Errors
    /// [`SkillError::BadCursor`].
    pub fn list(&self, cursor: Option<&str>) -> Result<Page, SkillError> {
        page(&self.skills, cursor, self.page_size, |s| s.entry.clone())
    }

    /// The entry of the skill whose `SKILL.md` is at `uri` (`skills/get`).
    ///
    /// # Errors
    /// [`SkillError::UnknownSkill`].
    pub fn get(&self, uri: &str) -> Result<Value, SkillError> {
        self.skills.get(uri).map(|s| s.entry.clone()).ok_or_else(|| SkillError::UnknownSkill(clip(uri)))
    }

    /// The `resources/read` result of a skill file, or `None` when `uri` is not one: the bytes as `text` when they
    /// are UTF-8, else as a base64 `blob`.
    #[must_use]
    pub fn read(&self, uri: &str) -> Option<Value> {
        let f = self.files.get(uri)?;
        let mut c = json!({ "uri": f.uri, "mimeType": f.mime });
        match std::str::from_utf8(&f.bytes) {
            Ok(text) => c["text"] = json!(text),
            Err(_) => c["blob"] = json!(base64::engine::general_purpose::STANDARD.encode(&f.bytes)),
        }
        Some(json!({ "contents": [c] }))
    }

    /// Whether `uri` is a file or a directory of this set.
    #[must_use]
    pub fn serves(&self, uri: &str) -> bool {
        self.files.contains_key(uri) || self.dirs.contains_key(uri)
    }

    /// A page of `resources/directory/read`: the direct children of the directory at `uri`, after `cursor`.
    ///
    /// # Errors
    /// [`SkillError::NotADirectory`] for a file or a URI this set does not serve; [`SkillError::BadCursor`].
    pub fn directory(&self, uri: &str, cursor: Option<&str>) -> Result<Page, SkillError> {
        let children = self.dirs.get(uri).ok_or_else(|| SkillError::NotADirectory(clip(uri)))?;
        page(children, cursor, self.page_size, Clone::clone)
    }

    /// The `resources/list` entries: each skill's `SKILL.md`, named and described by its frontmatter.
    #[must_use]
    pub fn resources(&self) -> Vec<Value> {
        self.skills.values().map(|s| s.listed()).collect()
    }
}

/// The page of `map` after the key `cursor` names.
fn page<T>(
    map: &BTreeMap<String, T>,
    cursor: Option<&str>,
    size: usize,
    item: impl Fn(&T) -> Value,
) -> Result<Page, SkillError> {
    let after = cursor.map(decode).transpose()?;
    let from = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
    let mut it = map.range::<str, _>((from, Bound::Unbounded));
    let taken: Vec<(&String, &T)> = it.by_ref().take(size).collect();
    let next_cursor = match (it.next(), taken.last()) {
        (Some(_), Some((last, _))) => Some(encode(last)),
        _ => None,
    };
    Ok(Page { items: taken.into_iter().map(|(_, v)| item(v)).collect(), next_cursor })
}

/// A cursor names the last key of its page, so that it means the same on every replica of one set.
fn encode(after: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("k1:{after}"))
}

fn decode(cursor: &str) -> Result<String, SkillError> {
    let raw = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| SkillError::BadCursor)?;
    let s = String::from_utf8(raw).map_err(|_| SkillError::BadCursor)?;
    s.strip_prefix("k1:").map(str::to_owned).ok_or(SkillError::BadCursor)
}

/// A URI quoted in an error, at most 256 characters.
fn clip(uri: &str) -> String {
    uri.chars().take(256).collect()
}

/// The directories `files` make: every level of every path, each with its direct children.
fn tree<'a>(files: impl Iterator<Item = &'a Arc<File>>) -> BTreeMap<String, BTreeMap<String, Value>> {
    let mut dirs: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for f in files {
        let path = &f.uri[SCHEME.len()..];
        let segs: Vec<&str> = path.split('/').collect();
        for depth in 1..segs.len() {
            let dir = format!("{SCHEME}{}", segs[..depth].join("/"));
            let child_uri = format!("{dir}/{}", segs[depth]);
            let child = if depth + 1 == segs.len() {
                json!({ "uri": child_uri, "name": f.name, "mimeType": f.mime, "size": f.bytes.len() })
            } else {
                json!({ "uri": child_uri, "name": segs[depth], "mimeType": DIRECTORY })
            };
            dirs.entry(dir).or_default().insert(child_uri, child);
        }
    }
    dirs
}

fn set_digest(skills: &BTreeMap<String, Arc<Skill>>) -> String {
    let mut text = String::new();
    for (uri, s) in skills {
        text.push_str("skill ");
        text.push_str(uri);
        text.push('\n');
        for (f, d, _) in s.files() {
            text.push_str(f);
            text.push(' ');
            text.push_str(d);
            text.push('\n');
        }
    }
    digest(text.as_bytes())
}

/// The paths (relative to `dir`, `/`-separated) of the directories below `dir` that hold a `SKILL.md`.
fn skill_dirs(dir: &Path, rel: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        if !e.file_type()?.is_dir() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let child = if rel.is_empty() { name } else { format!("{rel}/{name}") };
        if e.path().join(SKILL_MD).is_file() {
            out.push(child.clone());
        }
        skill_dirs(&e.path(), &child, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(path: &str, extra: &[(&str, &str)]) -> Skill {
        let name = path.rsplit('/').next().unwrap();
        let mut files = vec![("SKILL.md".to_owned(), format!("---\nname: {name}\ndescription: d\n---\n").into_bytes())];
        files.extend(extra.iter().map(|(p, b)| ((*p).to_owned(), b.as_bytes().to_vec())));
        Skill::new(path, files).unwrap()
    }

    #[test]
    fn pages_never_split_a_skill_and_cursors_round_trip() {
        let set = Skills::new((0..5).map(|i| skill(&format!("s{i}"), &[("a.md", "x")]))).unwrap().with_page_size(2);
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let p = set.list(cursor.as_deref()).unwrap();
            assert!(p.items.len() <= 2);
            seen.extend(p.items.iter().map(|e| e["uri"].as_str().unwrap().to_owned()));
            match p.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, (0..5).map(|i| format!("skill://s{i}/SKILL.md")).collect::<Vec<_>>());
        assert!(matches!(set.list(Some("garbage!")), Err(SkillError::BadCursor)));
    }

    #[test]
    fn directories_list_direct_children_and_refuse_files() {
        let set = Skills::new([skill("acme/pdf", &[("templates/a.md", "a"), ("templates/eu/b.md", "b")])]).unwrap();
        let root = set.directory("skill://acme/pdf", None).unwrap();
        let uris: Vec<_> = root.items.iter().map(|c| c["uri"].as_str().unwrap()).collect();
        assert_eq!(uris, ["skill://acme/pdf/SKILL.md", "skill://acme/pdf/templates"]);
        assert_eq!(root.items[1]["mimeType"], DIRECTORY);
        let t = set.directory("skill://acme/pdf/templates", None).unwrap();
        assert_eq!(t.items.len(), 2);
        assert_eq!(set.directory("skill://acme", None).unwrap().items[0]["uri"], "skill://acme/pdf");
        assert!(matches!(set.directory("skill://acme/pdf/SKILL.md", None), Err(SkillError::NotADirectory(_))));
        assert!(matches!(set.get("skill://nope/SKILL.md"), Err(SkillError::UnknownSkill(_))));
    }

    #[test]
    fn reads_are_the_digested_bytes_and_the_set_digest_moves_with_any_byte() {
        let a = Skills::new([skill("x", &[("f.txt", "one")])]).unwrap();
        let b = Skills::new([skill("x", &[("f.txt", "two")])]).unwrap();
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), Skills::new([skill("x", &[("f.txt", "one")])]).unwrap().digest());
        let r = a.read("skill://x/f.txt").unwrap();
        assert_eq!(r["contents"][0]["text"], "one");
        let bin = Skills::new([Skill::new(
            "y",
            vec![
                ("SKILL.md".into(), b"---\nname: y\ndescription: d\n---\n".to_vec()),
                ("b.bin".into(), vec![0xff, 0x00]),
            ],
        )
        .unwrap()])
        .unwrap();
        assert_eq!(bin.read("skill://y/b.bin").unwrap()["contents"][0]["blob"], "/wA=");
        assert!(a.read("skill://x/none").is_none());
    }

    #[test]
    fn a_directory_of_skills_loads_nested_skills_and_refuses_links() {
        let root = tempfile::tempdir().unwrap();
        let write = |p: &str, s: &str| {
            let p = root.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        write("outer/SKILL.md", "---\nname: outer\ndescription: d\n---\n");
        write("outer/inner/SKILL.md", "---\nname: inner\ndescription: d\n---\n");
        write("README.txt", "not a skill");
        let set = Skills::new(Skills::load_dir(root.path()).unwrap()).unwrap();
        assert_eq!(set.len(), 2);
        let outer = set.get("skill://outer/SKILL.md").unwrap();
        assert_eq!(outer["resources"].as_array().unwrap().len(), 2, "the nested skill's files are the outer's too");
        assert!(set.read("skill://README.txt").is_none());
        std::os::unix::fs::symlink("/etc/hostname", root.path().join("outer/link")).unwrap();
        assert!(Skills::load_dir(root.path()).unwrap_err().to_string().contains("symbolic link"));
        let empty = tempfile::tempdir().unwrap();
        assert!(Skills::load_dir(empty.path()).unwrap_err().to_string().contains("no directory below it"));
    }
}
