//! The reference tools that call a downstream API for the caller (docs/DOWNSTREAM.md): served only when the
//! server's `--downstreams` document names their downstream, and written on the framework alone
//! (`cx.downstream(name)`), as any tool writer's would be. The downstream's answer is third-party content: it goes
//! to the model in the untrusted envelope.
//!
//! | tool | downstream | what it accepts | annotations |
//! |---|---|---|---|
//! | `upcoming_events` | `calendar` (token exchange) | `days` (1–30) | read-only, idempotent, open world |
//! | `list_repositories` | `forge` (URL mode: the user's own consent) | `limit` (1–50) | read-only, idempotent, open world |

use mcpfleet_tools::envelope::Item;
use mcpfleet_tools::schemars::{self, JsonSchema};
use mcpfleet_tools::{Registry, Tool, ToolContext, ToolError, ToolInfo, ToolOutput, async_trait};
use serde::Deserialize;
use serde_json::Value;

/// The downstream `upcoming_events` reads.
pub const CALENDAR: &str = "calendar";
/// The downstream `list_repositories` reads: a third party the user authorizes once (URL mode).
pub const FORGE: &str = "forge";

/// Registers the downstream tools whose downstream is among `configured`.
///
/// # Errors
/// A tool that does not register (a bug of its own).
pub fn register<'a>(r: &mut Registry, configured: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
    for name in configured {
        match name {
            CALENDAR => {
                r.register(UpcomingEvents)?;
            }
            FORGE => {
                r.register(ListRepositories)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// `upcoming_events`: the caller's own calendar events for the next days, from the `calendar` downstream, with a
/// token the server exchanged for this caller.
#[derive(Debug)]
pub struct UpcomingEvents;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpcomingArgs {
    /// How many days ahead to look
    #[schemars(range(min = 1, max = 30))]
    days: u8,
}

#[async_trait]
impl Tool for UpcomingEvents {
    type Args = UpcomingArgs;

    fn info(&self) -> ToolInfo {
        super::reader("upcoming_events")
            .title("Upcoming events")
            .description("The calling user's own calendar events for the next days, from the calendar service.")
            .open_world()
    }

    async fn call(&self, args: UpcomingArgs, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
        let days = args.days.to_string();
        let answer = cx.downstream(CALENDAR).get_json("/events", &[("days", &days)]).await?;
        let events = answer.get("events").and_then(Value::as_array).cloned().unwrap_or_default();
        let items: Vec<Item> = events
            .iter()
            .map(|e| {
                let title = e.get("title").and_then(Value::as_str).unwrap_or_default();
                let in_days = e.get("in_days").and_then(Value::as_u64).unwrap_or_default();
                Item::new(title).attr("in_days", in_days.to_string())
            })
            .collect();
        // Who the calendar saw: the tests (and a curious user) can check that the token was the caller's own.
        let subject = answer.get("subject").and_then(Value::as_str).unwrap_or_default();
        let audience = answer.get("audience").and_then(Value::as_str).unwrap_or_default();
        Ok(ToolOutput::untrusted(CALENDAR, &items)
            .with_structured(serde_json::json!({ "count": items.len(), "subject": subject, "audience": audience })))
    }
}

/// `list_repositories`: the caller's repositories at the code host `forge`, with the token the user granted this
/// server there (URL mode: the first call asks the user to authorize it).
#[derive(Debug)]
pub struct ListRepositories;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// How many repositories at most
    #[schemars(range(min = 1, max = 50))]
    limit: u8,
}

#[async_trait]
impl Tool for ListRepositories {
    type Args = ListArgs;

    fn info(&self) -> ToolInfo {
        super::reader("list_repositories")
            .title("My repositories")
            .description("The calling user's repositories at the code host, once the user has authorized access.")
            .open_world()
    }

    async fn call(&self, args: ListArgs, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
        let limit = args.limit.to_string();
        let answer = cx.downstream(FORGE).get_json("/repos", &[("limit", &limit)]).await?;
        let repos = answer.get("repos").and_then(Value::as_array).cloned().unwrap_or_default();
        let items: Vec<Item> =
            repos.iter().map(|r| Item::new(r.get("name").and_then(Value::as_str).unwrap_or_default())).collect();
        let subject = answer.get("subject").and_then(Value::as_str).unwrap_or_default();
        Ok(ToolOutput::untrusted(FORGE, &items)
            .with_structured(serde_json::json!({ "count": items.len(), "subject": subject })))
    }
}
