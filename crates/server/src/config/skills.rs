//! `--skills DIR` (docs/SKILLS.md): the skills every replica serves, read once at start. The flags are checked
//! here; the directory is read with the tool writer's own skills when the catalog is checked
//! (`Server::check`), and any fault exits 64 with the skill and the rule it breaks.

use super::cli::config_error;
use crate::ServerError;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Skills")]
pub(super) struct SkillArgs {
    /// A directory of skills (the Agent Skills format): each directory below it with a SKILL.md is one, served
    /// as skill://<its path>/… with the io.modelcontextprotocol/skills extension. Read once at start; a changed
    /// skill set is a rollout.
    #[arg(long, env = "MCPFLEET_SKILLS", value_name = "DIR")]
    skills: Option<PathBuf>,
    /// Entries in one page of skills/list and resources/directory/read (1 to 1000).
    #[arg(long, env = "MCPFLEET_SKILLS_PAGE_SIZE", default_value_t = 50,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    skills_page_size: u16,
    /// The digest the skill set must have (`sha256:` and 64 lowercase hex digits, as the start-up log line and
    /// `mcpfleet_skills` print it): a replica whose skills differ refuses to start.
    #[arg(long, env = "MCPFLEET_SKILLS_DIGEST", value_name = "DIGEST")]
    skills_digest: Option<String>,
}

/// `--skills`, `--skills-page-size` and `--skills-digest`.
#[derive(Clone, Debug, Default)]
pub struct SkillsConfig {
    /// The directory read at start, beside the skills the server's own code adds.
    pub dir: Option<PathBuf>,
    pub page_size: usize,
    /// The digest the served set must have.
    pub digest: Option<String>,
}

impl SkillArgs {
    pub(super) fn into_config(self) -> Result<SkillsConfig, ServerError> {
        if let Some(d) = &self.skills_digest {
            let hex = d.strip_prefix("sha256:").unwrap_or_default();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(config_error(format!("--skills-digest {d:?} must be sha256: and 64 lowercase hex digits")));
            }
        }
        if let Some(dir) = &self.skills
            && !dir.is_dir()
        {
            return Err(config_error(format!("--skills {}: not a directory", dir.display())));
        }
        Ok(SkillsConfig { dir: self.skills, page_size: usize::from(self.skills_page_size), digest: self.skills_digest })
    }
}
