//! One skill: its path, its `SKILL.md` frontmatter, and its files with their digests, read once and never changed.

use crate::{MAX_FILES, MAX_TOTAL_BYTES, SCHEME, SKILL_MD, SkillError};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;

/// One file of a skill: its path inside the skill, its bytes, and their digest.
#[derive(Debug)]
pub(crate) struct File {
    pub(crate) uri: String,
    pub(crate) name: String,
    pub(crate) bytes: Arc<[u8]>,
    /// `sha256:<64 lowercase hex>` over [`bytes`](Self::bytes).
    pub(crate) digest: String,
    pub(crate) mime: &'static str,
}

/// A skill (the Agent Skills format): a directory with a `SKILL.md` that begins with YAML frontmatter naming it,
/// plus any other files. Built with [`Skill::new`] from bytes, or read from a directory by
/// [`Skills::load_dir`](crate::Skills::load_dir); immutable once built.
#[derive(Debug)]
pub struct Skill {
    path: String,
    frontmatter: Map<String, Value>,
    pub(crate) files: Vec<Arc<File>>,
    /// The `skills/list` and `skills/get` entry, built once.
    pub(crate) entry: Value,
}

impl Skill {
    /// A skill served at `skill://<path>/`, from its files: `(path inside the skill, bytes)`, one of which must be
    /// `SKILL.md`. `path` is one or more `/`-separated segments; its last must equal the frontmatter's `name`.
    ///
    /// # Errors
    /// [`SkillError::Invalid`]: a bad path or file name, a missing or malformed `SKILL.md`, a name or description
    /// the Agent Skills rules refuse, a file listed twice, or more than 512 files or 16 MiB.
    pub fn new(path: &str, files: Vec<(String, Vec<u8>)>) -> Result<Self, SkillError> {
        let bad = |why: String| SkillError::Invalid { skill: path.to_owned(), why };
        check_path(path, "skill path").map_err(bad)?;
        if files.len() > MAX_FILES {
            return Err(bad(format!("it has {} files; a skill may have at most {MAX_FILES}", files.len())));
        }
        let total: usize = files.iter().map(|(_, b)| b.len()).sum();
        if total > MAX_TOTAL_BYTES {
            return Err(bad(format!("its files total {total} bytes; a skill may total at most {MAX_TOTAL_BYTES}")));
        }
        let mut built: Vec<Arc<File>> = Vec::with_capacity(files.len());
        for (name, bytes) in files {
            check_path(&name, "file path").map_err(bad)?;
            let uri = format!("{SCHEME}{path}/{name}");
            if built.iter().any(|f| f.uri == uri) {
                return Err(bad(format!("the file {name} is listed twice")));
            }
            let base = name.rsplit('/').next().unwrap_or(&name).to_owned();
            built.push(Arc::new(File {
                digest: digest(&bytes),
                mime: mime_of(&base, &bytes),
                name: base,
                uri,
                bytes: bytes.into(),
            }));
        }
        built.sort_by(|a, b| a.uri.cmp(&b.uri));
        let skill_md = format!("{SCHEME}{path}/{SKILL_MD}");
        let Some(md) = built.iter().find(|f| f.uri == skill_md) else {
            return Err(bad(format!("it has no {SKILL_MD} at its root")));
        };
        let frontmatter = frontmatter(&md.bytes).map_err(bad)?;
        let name = frontmatter.get("name").and_then(Value::as_str).unwrap_or_default();
        let last = path.rsplit('/').next().unwrap_or(path);
        if name != last {
            return Err(bad(format!(
                "its frontmatter names it {name:?}, but the last segment of its path is {last:?}; they must be equal"
            )));
        }
        let entry = json!({
            "uri": skill_md,
            "frontmatter": frontmatter,
            "resources": built.iter().map(|f| json!({ "uri": f.uri, "digest": f.digest, "size": f.bytes.len() }))
                .collect::<Vec<_>>(),
        });
        Ok(Self { path: path.to_owned(), frontmatter, files: built, entry })
    }

    /// Reads the skill in `dir`, served at `skill://<path>/`: every regular file under it, nested skills'
    /// included (to the enclosing skill they are supporting files).
    ///
    /// # Errors
    /// [`SkillError::Read`] when a file cannot be read, a symbolic link, or a name that is not UTF-8;
    /// [`SkillError::Invalid`] as [`new`](Self::new).
    pub fn from_dir(dir: &Path, path: &str) -> Result<Self, SkillError> {
        let mut files = Vec::new();
        collect(dir, "", &mut files)?;
        Self::new(path, files)
    }

    /// The skill's path (`skill://<path>/SKILL.md` is its URI).
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The URI of its `SKILL.md`, which names the skill.
    #[must_use]
    pub fn uri(&self) -> &str {
        self.entry["uri"].as_str().unwrap_or_default()
    }

    /// Its `SKILL.md` frontmatter, as JSON.
    #[must_use]
    pub fn frontmatter(&self) -> &Map<String, Value> {
        &self.frontmatter
    }

    /// Its files: `(URI, digest, size)`, in URI order.
    pub fn files(&self) -> impl Iterator<Item = (&str, &str, usize)> {
        self.files.iter().map(|f| (f.uri.as_str(), f.digest.as_str(), f.bytes.len()))
    }

    /// The `resources/list` entry of its `SKILL.md`: name and description from the frontmatter.
    pub(crate) fn listed(&self) -> Value {
        let size = self.files.iter().find(|f| f.uri == self.uri()).map_or(0, |f| f.bytes.len());
        json!({
            "uri": self.uri(),
            "name": self.frontmatter.get("name"),
            "description": self.frontmatter.get("description"),
            "mimeType": "text/markdown",
            "size": size,
        })
    }
}

/// Every regular file under `dir`, as `(path relative to the skill, bytes)`.
fn collect(dir: &Path, rel: &str, out: &mut Vec<(String, Vec<u8>)>) -> Result<(), SkillError> {
    let read = |e: std::io::Error, p: &Path| SkillError::Read { path: p.display().to_string(), why: e.to_string() };
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).map_err(|e| read(e, dir))?.collect::<Result<_, _>>().map_err(|e| read(e, dir))?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        let p = e.path();
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            return Err(SkillError::Read { path: p.display().to_string(), why: "its name is not UTF-8".into() });
        };
        let kind = e.file_type().map_err(|x| read(x, &p))?;
        let child = if rel.is_empty() { name } else { format!("{rel}/{name}") };
        if kind.is_symlink() {
            return Err(SkillError::Read {
                path: p.display().to_string(),
                why: "a symbolic link: a skill serves only the files inside its directory, copy the file in".into(),
            });
        } else if kind.is_dir() {
            collect(&p, &child, out)?;
        } else if kind.is_file() {
            out.push((child, std::fs::read(&p).map_err(|x| read(x, &p))?));
            if out.len() > MAX_FILES {
                // Stop reading: the skill is refused anyway.
                return Ok(());
            }
        }
    }
    Ok(())
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", mcpfleet_core::hex(&Sha256::digest(bytes)))
}

/// Checks a skill path or a file path: `/`-separated segments of URI-unreserved characters, none empty, `.` or
/// `..`.
fn check_path(p: &str, what: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > 512 {
        return Err(format!("the {what} must have 1 to 512 characters"));
    }
    for seg in p.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(format!("the {what} {p:?} has an empty, '.' or '..' segment"));
        }
        if let Some(c) = seg.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~'))) {
            return Err(format!(
                "the {what} {p:?} has the character {c:?}; names in a skill:// URI use only letters, digits, '-', \
                 '.', '_' and '~'"
            ));
        }
    }
    Ok(())
}

/// The YAML frontmatter at the start of a `SKILL.md`, as a JSON object with a valid `name` and `description`.
pub(crate) fn frontmatter(md: &[u8]) -> Result<Map<String, Value>, String> {
    let text = std::str::from_utf8(md).map_err(|_| format!("its {SKILL_MD} is not UTF-8"))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let no_block = || format!("its {SKILL_MD} does not begin with a YAML frontmatter block between '---' lines");
    let body = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")).ok_or_else(no_block)?;
    let mut yaml_end = None;
    let mut at = 0;
    for line in body.split_inclusive('\n') {
        if line.trim_end_matches(['\r', '\n']).trim_end_matches([' ', '\t']) == "---" {
            yaml_end = Some(at);
            break;
        }
        at += line.len();
    }
    let yaml = &body[..yaml_end.ok_or_else(no_block)?];
    // YAML 1.2's booleans (`true`/`false` only), as hosts read frontmatter: a skill named `y` or `on` is a string.
    let options = serde_saphyr::options! { strict_booleans: true };
    let value: Value = serde_saphyr::from_str_with_options(yaml, options)
        .map_err(|e| format!("its frontmatter is not valid YAML: {}", first_line(&e)))?;
    let Value::Object(fm) = value else {
        return Err("its frontmatter is not a YAML mapping".to_owned());
    };
    let name = fm.get("name").and_then(Value::as_str).ok_or("its frontmatter has no string `name`")?;
    if !valid_name(name) {
        return Err(format!(
            "its name {name:?} breaks the Agent Skills rules: 1 to 64 lowercase letters, digits and hyphens, no \
             leading, trailing or double hyphen"
        ));
    }
    match fm.get("description").and_then(Value::as_str) {
        Some(d) if !d.trim().is_empty() && d.chars().count() <= 1024 => Ok(fm),
        _ => Err("its frontmatter needs a `description` string of 1 to 1024 characters".to_owned()),
    }
}

fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

/// The Agent Skills naming rule: `^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$` with no `--`.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !n.starts_with('-')
        && !n.ends_with('-')
        && !n.contains("--")
}

/// A file's media type, by its extension; text that is not one of those is `text/plain`.
fn mime_of(name: &str, bytes: &[u8]) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "md" | "markdown" => "text/markdown",
        "txt" => "text/plain",
        "json" => "application/json",
        "yaml" | "yml" => "application/yaml",
        "py" => "text/x-python",
        "sh" => "text/x-shellscript",
        "js" | "mjs" => "text/javascript",
        "ts" => "text/x-typescript",
        "html" | "htm" => "text/html",
        "csv" => "text/csv",
        "xml" => "application/xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        _ if std::str::from_utf8(bytes).is_ok() => "text/plain",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(name: &str, desc: &str) -> Vec<u8> {
        format!("---\nname: {name}\ndescription: {desc}\n---\n\n# Body\n").into_bytes()
    }

    #[test]
    fn a_skill_lists_every_file_with_its_digest_and_size() {
        let s = Skill::new(
            "acme/refunds",
            vec![
                ("SKILL.md".into(), md("refunds", "Process refunds")),
                ("examples/email.md".into(), b"hello".to_vec()),
            ],
        )
        .unwrap();
        assert_eq!(s.uri(), "skill://acme/refunds/SKILL.md");
        let r = s.entry["resources"].as_array().unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0]["uri"], "skill://acme/refunds/SKILL.md");
        assert_eq!(r[1]["uri"], "skill://acme/refunds/examples/email.md");
        assert_eq!(r[1]["size"], 5);
        // sha256("hello")
        assert_eq!(r[1]["digest"], "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
        assert_eq!(s.entry["frontmatter"], json!({ "name": "refunds", "description": "Process refunds" }));
    }

    #[test]
    fn frontmatter_passes_through_verbatim_and_names_follow_the_rules() {
        let fm = frontmatter(b"---\nname: a-b\ndescription: d\nlicense: MIT\nmetadata:\n  v: 2\n---\nx").unwrap();
        assert_eq!(frontmatter(b"---\nname: on\ndescription: d\n---\n").unwrap()["name"], "on", "YAML 1.2");
        assert_eq!(
            Value::Object(fm),
            json!({ "name": "a-b", "description": "d", "license": "MIT", "metadata": { "v": 2 } })
        );
        for bad in ["A", "-a", "a-", "a--b", "a_b", ""] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert!(valid_name("pdf-processing") && valid_name(&"a".repeat(64)) && !valid_name(&"a".repeat(65)));
        assert!(frontmatter(b"# no frontmatter").unwrap_err().contains("does not begin"));
        assert!(frontmatter(b"---\nname: x\n---\n").unwrap_err().contains("description"));
        assert!(frontmatter(b"---\nname: [\n---\n").unwrap_err().contains("not valid YAML"));
    }

    #[test]
    fn bad_skills_are_refused_with_the_reason() {
        let err = |path: &str, files: Vec<(String, Vec<u8>)>| Skill::new(path, files).unwrap_err().to_string();
        assert!(err("x", vec![("a.md".into(), vec![])]).contains("no SKILL.md"));
        assert!(err("other", vec![("SKILL.md".into(), md("x", "d"))]).contains("must be equal"));
        assert!(err("x", vec![("SKILL.md".into(), md("x", "d")), ("a b.md".into(), vec![])]).contains("' '"));
        assert!(err("x", vec![("SKILL.md".into(), md("x", "d")), ("../e".into(), vec![])]).contains("'..'"));
        let many = (0..=MAX_FILES).map(|i| (format!("f{i}"), vec![])).collect();
        assert!(err("x", many).contains("at most 512"));
    }
}
