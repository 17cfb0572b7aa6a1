//! What a server offers: the tools registered with [`crate::Server::tool`] and the catalog given with
//! [`crate::Server::catalog`] (resources, prompts, completions, and any tools of its own), served as one
//! [`Catalog`]; and the start-up checks every catalog passes before a replica serves it: each tool's input schema
//! passes the lint, no tool name is taken twice, and every `--quota` names a tool of this server.

use crate::ServerError;
use mcpfleet_skills::{Skill, Skills};
use mcpfleet_tools::validate::Validator;
use mcpfleet_tools::{Catalog, EmptyCatalog, JsonObject, Quota, Registry, TaskSupport, ToolContext, ToolError};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The registry's tools beside the rest of a catalog: a tool name is looked up in the registry first.
#[derive(Debug)]
pub(crate) struct Combined {
    pub(crate) tools: Registry,
    pub(crate) rest: Option<Arc<dyn Catalog>>,
    pub(crate) instructions: Option<String>,
}

impl Combined {
    fn owner(&self, tool: &str) -> Option<&dyn Catalog> {
        if self.tools.input_schema(tool).is_some() { Some(&self.tools) } else { self.rest.as_deref() }
    }
}

#[mcpfleet_tools::async_trait]
impl Catalog for Combined {
    /// The catalog's capabilities (with none, those of a server with nothing registered: `tools` and `logging`),
    /// with `tools` and `logging` added when tools are registered (a tool may log).
    fn capabilities(&self) -> Value {
        let mut caps = self.rest.as_ref().map_or_else(|| EmptyCatalog.capabilities(), |r| r.capabilities());
        if !self.tools.is_empty()
            && let Some(c) = caps.as_object_mut()
        {
            c.entry("tools").or_insert_with(|| json!({ "listChanged": false }));
            c.entry("logging").or_insert_with(|| json!({}));
        }
        caps
    }

    fn instructions(&self) -> Option<String> {
        self.instructions.clone().or_else(|| self.rest.as_ref().and_then(|r| r.instructions()))
    }

    fn tools(&self) -> Vec<Value> {
        let mut all = self.tools.tools();
        if let Some(r) = &self.rest {
            all.extend(r.tools());
        }
        all
    }

    fn tool_scopes(&self, tool: &str) -> Vec<String> {
        self.owner(tool).map(|c| c.tool_scopes(tool)).unwrap_or_default()
    }

    fn tool_quota(&self, tool: &str) -> Option<Quota> {
        self.owner(tool).and_then(|c| c.tool_quota(tool))
    }

    fn tool_timeout(&self, tool: &str) -> Option<Duration> {
        self.owner(tool).and_then(|c| c.tool_timeout(tool))
    }

    fn tool_task(&self, tool: &str) -> TaskSupport {
        self.owner(tool).map(|c| c.tool_task(tool)).unwrap_or_default()
    }

    async fn call_tool(&self, name: &str, args: JsonObject, cx: &dyn ToolContext) -> Result<Value, ToolError> {
        match self.owner(name) {
            Some(c) => c.call_tool(name, args, cx).await,
            None => Err(ToolError::UnknownTool(name.chars().take(128).collect())),
        }
    }

    fn resources(&self) -> Vec<Value> {
        self.rest.as_ref().map(|r| r.resources()).unwrap_or_default()
    }

    fn resource_templates(&self) -> Vec<Value> {
        self.rest.as_ref().map(|r| r.resource_templates()).unwrap_or_default()
    }

    async fn read_resource(&self, uri: &str) -> Result<Value, ToolError> {
        match &self.rest {
            Some(r) => r.read_resource(uri).await,
            None => Err(ToolError::ResourceNotFound(uri.to_owned())),
        }
    }

    fn prompts(&self) -> Vec<Value> {
        self.rest.as_ref().map(|r| r.prompts()).unwrap_or_default()
    }

    async fn get_prompt(&self, name: &str, args: &JsonObject) -> Result<Value, ToolError> {
        match &self.rest {
            Some(r) => r.get_prompt(name, args).await,
            None => Err(ToolError::UnknownPrompt(name.to_owned())),
        }
    }

    async fn get_prompt_with(&self, name: &str, args: &JsonObject, cx: &dyn ToolContext) -> Result<Value, ToolError> {
        match &self.rest {
            Some(r) => r.get_prompt_with(name, args, cx).await,
            None => Err(ToolError::UnknownPrompt(name.to_owned())),
        }
    }

    async fn complete(&self, reference: &Value, argument: &Value) -> Result<Value, ToolError> {
        match &self.rest {
            Some(r) => r.complete(reference, argument).await,
            None => Ok(json!({ "completion": { "values": [], "hasMore": false } })),
        }
    }
}

/// A catalog after the start-up checks: its tools' input schemas pass the lint, no name is taken twice, and every
/// `--quota` names one of its tools. Built once, before logging starts, so that a refusal is one line.
#[derive(Debug)]
pub(crate) struct CheckedCatalog {
    pub(crate) catalog: Arc<dyn Catalog>,
    /// Its `tools/list` entries.
    pub(crate) tools: Vec<Value>,
    /// Lint warnings, for the log.
    pub(crate) warnings: Vec<String>,
    /// Its input schemas, compiled: every call is checked against them before its tool runs.
    pub(crate) validator: Arc<Validator>,
    /// The skills served beside it (docs/SKILLS.md).
    pub(crate) skills: Arc<Skills>,
}

/// A `tools/list` entry's name.
pub(crate) fn tool_name(t: &Value) -> &str {
    t.get("name").and_then(Value::as_str).unwrap_or("?")
}

impl CheckedCatalog {
    /// Checks `catalog` against the operator's `quotas` (the tool names of `--quota`).
    ///
    /// # Errors
    /// [`ServerError::Config`]: a tool schema fails the lint (every offence as `tool pointer: message (rule)`) or
    /// does not compile (a `format` the validator does not know, say), a tool name is listed twice, or a `--quota`
    /// names a tool this server does not have.
    pub(crate) fn new<'a>(
        catalog: Arc<dyn Catalog>,
        quotas: impl IntoIterator<Item = &'a String>,
    ) -> Result<Self, ServerError> {
        let tools = catalog.tools();
        let (mut errors, mut warnings) = (Vec::new(), Vec::new());
        let mut seen = std::collections::BTreeSet::new();
        for tool in &tools {
            if !seen.insert(tool_name(tool)) {
                errors.push(format!("{} is listed twice", tool_name(tool)));
            }
            for f in mcpfleet_tools::lint::lint_tool(tool) {
                let line = format!("{} {f}", tool_name(tool));
                match f.severity {
                    mcpfleet_tools::lint::Severity::Error => errors.push(line),
                    mcpfleet_tools::lint::Severity::Warning => warnings.push(line),
                }
            }
        }
        if !errors.is_empty() {
            return Err(ServerError::Config(format!("tool input schemas fail the lint: {}", errors.join("; "))));
        }
        // A quota for a tool that does not exist is a typo that would silently limit nothing.
        if let Some(unknown) = quotas.into_iter().find(|q| !seen.contains(q.as_str())) {
            return Err(ServerError::Config(format!("--quota names {unknown:?}, which is not a tool of this server")));
        }
        let validator = Arc::new(Validator::new(&tools).map_err(ServerError::Config)?);
        Ok(Self { catalog, tools, warnings, validator, skills: Arc::new(Skills::empty()) })
    }
}

/// The skill set a replica serves: `added` (the server's own, [`crate::Server::skill`]) and every skill under
/// `dirs` ([`crate::Server::skills_dir`], `--skills`), paged by `page_size`; when `pinned`, its digest must be that.
///
/// # Errors
/// [`ServerError::Config`]: a skill the extension's rules refuse, a directory that cannot be read or holds no
/// skill, one URI served twice, or a digest other than `pinned`.
pub(crate) fn skills(
    added: Vec<Skill>,
    dirs: &[std::path::PathBuf],
    page_size: usize,
    pinned: Option<&str>,
) -> Result<Skills, ServerError> {
    let mut all = added;
    for d in dirs {
        all.extend(Skills::load_dir(d).map_err(|e| ServerError::Config(format!("skills: {e}")))?);
    }
    let set = Skills::new(all).map_err(|e| ServerError::Config(format!("skills: {e}")))?.with_page_size(page_size);
    match pinned {
        Some(want) if want != set.digest() => Err(ServerError::Config(format!(
            "--skills-digest: the skills read have the digest {}, not {want}: this replica would serve other skills \
             than the fleet's",
            set.digest()
        ))),
        _ => Ok(set),
    }
}
