//! The Redis layout's versions: one per key family, and the rule that lets two releases share a fleet
//! (docs/UPGRADING.md, "The rule"). A family's version changes when what one build writes there could be misread
//! by a build of the version before (a field renamed, an encoding changed); a key or a field that older builds
//! ignore is no change. A build declares, per family, the version it writes and the versions it reads; two builds
//! share a fleet when each reads what the other writes.
//!
//! Each replica records its declaration beside its membership record (`<p>{fleet}:layout`, renewed with it), and
//! checks the live replicas' declarations once, when it first reaches the store, before it serves: a replica whose
//! layout cannot be shared with one already running refuses to start (the server's exit 78). A live replica with no
//! declaration is a build from before declarations (release 0.1.0): every family at version 1.

use std::fmt;

/// One family's versions in a declaration: the one written, and the range read (which holds it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    /// What this build writes.
    pub writes: u16,
    /// The oldest version this build reads.
    pub reads_from: u16,
    /// The newest version this build reads (at least `writes`: an expand release reads one ahead).
    pub reads_to: u16,
}

impl Version {
    /// Writes and reads `v` alone.
    #[must_use]
    pub const fn only(v: u16) -> Self {
        Self { writes: v, reads_from: v, reads_to: v }
    }

    fn reads(self, v: u16) -> bool {
        (self.reads_from..=self.reads_to).contains(&v)
    }
}

/// The key families of the builds from before declarations (release 0.1.0), as declarations name them. Fixed: a
/// family added later is not one of them (a build without declarations does not touch it).
pub const FAMILIES: [&str; 8] =
    ["sessions", "events", "limits", "tasks", "idempotency", "state", "members", "channels"];

/// This build's layout: every family at version 1 (release 0.1.0's layout), `policy` (the fleet's policy version in
/// force and its notice channel), `grants` (URL-mode downstream grants and authorizations in progress) and
/// `declarations` (facts the replicas compare, like their skill sets' digests), which 0.1.0 does not touch.
pub const CURRENT: [(&str, Version); 11] = [
    ("sessions", Version::only(1)),
    ("events", Version::only(1)),
    ("limits", Version::only(1)),
    ("tasks", Version::only(1)),
    ("idempotency", Version::only(1)),
    ("state", Version::only(1)),
    ("members", Version::only(1)),
    ("channels", Version::only(1)),
    ("policy", Version::only(1)),
    ("grants", Version::only(1)),
    ("declarations", Version::only(1)),
];

/// A build's declaration: its families' versions. Families it does not name, it does not touch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    families: Vec<(String, Version)>,
}

impl Layout {
    /// This build's layout ([`CURRENT`]).
    #[must_use]
    pub fn current() -> Self {
        Self::of(&CURRENT)
    }

    /// A layout of the given families.
    #[must_use]
    pub fn of(families: &[(&str, Version)]) -> Self {
        Self { families: families.iter().map(|(f, v)| ((*f).to_owned(), *v)).collect() }
    }

    /// The layout of a build from before declarations (release 0.1.0): every family of [`FAMILIES`] at 1.
    #[must_use]
    pub fn undeclared() -> Self {
        Self { families: FAMILIES.iter().map(|f| ((*f).to_owned(), Version::only(1))).collect() }
    }

    /// The declaration as it is stored: `family:writes:from-to`, comma-separated.
    #[must_use]
    pub fn encode(&self) -> String {
        let parts: Vec<String> =
            self.families.iter().map(|(f, v)| format!("{f}:{}:{}-{}", v.writes, v.reads_from, v.reads_to)).collect();
        parts.join(",")
    }

    /// Parses a stored declaration; `None` if it is not one (a later build's format this one cannot read).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        let mut families = Vec::new();
        for part in s.split(',') {
            let mut it = part.split(':');
            let (name, writes, reads) = (it.next()?, it.next()?.parse().ok()?, it.next()?);
            let (from, to) = reads.split_once('-')?;
            let v = Version { writes, reads_from: from.parse().ok()?, reads_to: to.parse().ok()? };
            if it.next().is_some() || name.is_empty() || !v.reads(v.writes) {
                return None;
            }
            families.push((name.to_owned(), v));
        }
        Some(Self { families })
    }

    fn get(&self, family: &str) -> Option<Version> {
        self.families.iter().find(|(f, _)| f == family).map(|(_, v)| *v)
    }

    /// Whether this build and `other` can share a fleet: each reads what the other writes, in every family both
    /// touch. The first family where they cannot, otherwise.
    ///
    /// # Errors
    /// The [`Conflict`].
    pub fn shares_with(&self, other: &Self) -> Result<(), Conflict> {
        for (family, mine) in &self.families {
            let Some(theirs) = other.get(family) else { continue };
            if !mine.reads(theirs.writes) || !theirs.reads(mine.writes) {
                return Err(Conflict::Versions { family: family.clone(), mine: *mine, theirs });
            }
        }
        Ok(())
    }
}

/// Why two layouts cannot share a fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// In `family`, one of the two does not read what the other writes.
    Versions { family: String, mine: Version, theirs: Version },
    /// A live replica's declaration is in a form this build cannot read.
    Unreadable(String),
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Versions { family, mine, theirs } => write!(
                f,
                "a live replica writes the Redis layout's {family} at version {} and reads {}-{}; this build writes \
                 {} and reads {}-{}: the two cannot share a fleet (roll out the release in between first, or wait \
                 until the other replicas are gone; docs/UPGRADING.md)",
                theirs.writes, theirs.reads_from, theirs.reads_to, mine.writes, mine.reads_from, mine.reads_to
            ),
            Self::Unreadable(raw) => write!(
                f,
                "a live replica declares a Redis layout this build cannot read ({raw:?}): it is a later release \
                 than this one can share a fleet with (docs/UPGRADING.md)"
            ),
        }
    }
}

/// Checks this build's layout against the live replicas' declarations (`None`: a build from before declarations).
///
/// # Errors
/// The first [`Conflict`].
pub fn check(mine: &Layout, fleet: &[Option<String>]) -> Result<(), Conflict> {
    for declared in fleet {
        let theirs = match declared {
            None => Layout::undeclared(),
            Some(raw) => Layout::parse(raw).ok_or_else(|| Conflict::Unreadable(raw.clone()))?,
        };
        mine.shares_with(&theirs)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declaration_reads_back_as_written() {
        let current = Layout::current();
        assert_eq!(Layout::parse(&current.encode()), Some(current.clone()));
        let names: Vec<_> = CURRENT.iter().map(|(f, _)| *f).collect();
        assert_eq!(names[..FAMILIES.len()], FAMILIES, "0.1.0's families, then those added since");
        assert!(CURRENT.iter().all(|(_, v)| *v == Version::only(1)), "every family at 0.1.0's version");
        assert_eq!(current.shares_with(&Layout::undeclared()), Ok(()));
        assert_eq!(Layout::undeclared().shares_with(&current), Ok(()));
        for bad in ["", "events", "events:1", "events:1:1", "events:x:1-1", "events:2:1-1", "events:1:1-1:9", ":1:1-1"]
        {
            assert_eq!(Layout::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn one_release_apart_both_ways_and_no_further() {
        let v1 = Layout::undeclared();
        // An expand release: still writes 1, reads 2 as well.
        let expand = Layout::of(&[("events", Version { writes: 1, reads_from: 1, reads_to: 2 })]);
        // The contract release after it: writes 2, still reads 1.
        let contract = Layout::of(&[("events", Version { writes: 2, reads_from: 1, reads_to: 2 })]);
        // A change in one step: writes 2 and reads only 2.
        let one_step = Layout::of(&[("events", Version::only(2))]);
        assert_eq!(expand.shares_with(&v1), Ok(()));
        assert_eq!(v1.shares_with(&expand), Ok(()));
        assert_eq!(contract.shares_with(&expand), Ok(()));
        assert_eq!(expand.shares_with(&contract), Ok(()));
        assert!(contract.shares_with(&v1).is_err(), "two releases apart: 1 does not read 2");
        assert!(v1.shares_with(&contract).is_err());
        assert!(one_step.shares_with(&v1).is_err());
        // A family only one of them has is no conflict.
        assert_eq!(Layout::of(&[("skills", Version::only(4))]).shares_with(&v1), Ok(()));
    }

    #[test]
    fn a_fleet_is_checked_member_by_member() {
        let mine = Layout::current();
        assert_eq!(check(&mine, &[None, Some(mine.encode())]), Ok(()));
        let later = Layout::of(&[("events", Version::only(3))]).encode();
        let err = check(&mine, &[None, Some(later)]).unwrap_err();
        assert!(err.to_string().contains("events at version 3"), "{err}");
        assert!(matches!(check(&mine, &[Some("v2;events=3".to_owned())]), Err(Conflict::Unreadable(_))));
    }
}
