//! mcpfleet-skills owns the Skills extension's content (`io.modelcontextprotocol/skills`, docs/SKILLS.md): skill
//! directories loaded once at start ([`Skills::load_dir`]) or built by a tool writer ([`Skill::new`]), each file's
//! `sha256:` digest and size computed when it is read, and the answers built from them: `skills/list` pages (a
//! skill never split), `skills/get`, `resources/read` of a `skill://` file, `resources/directory/read`, and the
//! set's own digest, which replicas compare across the fleet. A [`Skills`] never changes: a changed skill set is a
//! rollout.
//!
//! It depends on core only among our crates (for hex) and knows nothing of HTTP, JSON-RPC, the store or the
//! transport, which serves these answers and maps [`SkillError`] to `-32602`.

mod set;
mod skill;

pub use set::{Page, Skills};
pub use skill::Skill;

/// The extension's identifier, under `capabilities.extensions`.
pub const EXTENSION: &str = "io.modelcontextprotocol/skills";
/// The scheme skills are served under.
pub const SCHEME: &str = "skill://";
/// The file that makes a directory a skill.
pub const SKILL_MD: &str = "SKILL.md";
/// The most files a skill may have (the extension's limit, `SKILL.md` included).
pub const MAX_FILES: usize = 512;
/// The most bytes a skill's files may total (the extension's limit: 16 MiB).
pub const MAX_TOTAL_BYTES: usize = 16 * 1024 * 1024;
/// The media type of a directory resource.
pub const DIRECTORY: &str = "inode/directory";

/// Why a skill could not be loaded, or a request about skills could not be answered. Messages are safe to show: a
/// load error names the skill and the rule it breaks, a request error the URI or cursor the caller sent.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    #[error("skill {skill:?} is refused: {why}")]
    Invalid { skill: String, why: String },
    #[error("cannot read {path}: {why}")]
    Read { path: String, why: String },
    #[error("skill {0} is served twice")]
    Duplicate(String),
    #[error("no skill is served at {0}")]
    UnknownSkill(String),
    #[error("{0} is not a directory resource")]
    NotADirectory(String),
    #[error("the cursor is not one this server gave out")]
    BadCursor,
}
