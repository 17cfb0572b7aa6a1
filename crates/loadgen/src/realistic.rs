//! The realistic work of issue 32 (target 4): the `--op`s whose loop iteration is more than one plain call, each
//! with the answer checked for what the workload is about. One iteration is one op in the report: its latency,
//! its outcome, and the CPU per op; `requests_per_op` says how many HTTP requests it took.
//!
//! - `progress`: a `tools/call` of `bench_progress` with a `progressToken`, read over SSE to its answer: exactly
//!   [`PROGRESS_COUNT`] progress notifications, then the answer [`PROGRESS_TEXT`].
//! - `blob`: a `tools/call` of `bench_blob`: one text block of [`BLOB_BYTES`] bytes.
//! - `resume` (`--generation 2025`): the `progress` call, keeping the id of its first event (the priming event),
//!   read to its end; then a GET of the same endpoint with `Last-Event-ID: <that id>`, read to its end: the same
//!   notifications and answer, replayed. One op is the call and the resume: two requests.
//! - `task` (`--generation 2026`): a `tools/call` of a tool the server runs as a task (`slow_job` of 0 s), then
//!   `tasks/get` after `tasks/get`, with no pause, until the task is `completed`; that last answer carries the
//!   result. One op is the creation and every poll: `requests_per_op` − 1 polls.
//!
//! The tools are the conformance fixtures of those names, which `crates/rmcp-baseline` serves too.

use super::{Kind, Session, stateless_meta};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The tool of `progress` and `resume`, and what it sends and answers.
pub(crate) const PROGRESS_TOOL: &str = "bench_progress";
pub(crate) const PROGRESS_COUNT: usize = 5;
pub(crate) const PROGRESS_TEXT: &str = "sent 5 progress notifications";
/// The tool of `blob`, and the length of its text.
pub(crate) const BLOB_TOOL: &str = "bench_blob";
pub(crate) const BLOB_BYTES: usize = 65_536;
/// The tool of `task`, with its arguments: a task that has nothing to do.
pub(crate) const TASK_TOOL: &str = "slow_job";
pub(crate) const TASK_ARGS: &str = r#"{"seconds":0}"#;
/// How long a `task` op polls before it counts as failed.
const TASK_DEADLINE: Duration = Duration::from_secs(30);

/// What an op is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    Progress,
    Blob,
    Resume,
    Task,
}

impl Work {
    /// The tool and arguments the op calls unless `--tool` and `--args` say otherwise.
    pub(crate) fn default_tool(self) -> (&'static str, &'static str) {
        match self {
            Self::Progress | Self::Resume => (PROGRESS_TOOL, "{}"),
            Self::Blob => (BLOB_TOOL, "{}"),
            Self::Task => (TASK_TOOL, TASK_ARGS),
        }
    }

    /// What session `n` sends first: `call` (a `tools/call`), with a progress token for the ops that stream.
    pub(crate) fn body(self, call: &Value, n: usize) -> Value {
        let mut body = call.clone();
        if matches!(self, Self::Progress | Self::Resume) {
            body["params"]["_meta"]["progressToken"] = json!(format!("bench-{n}"));
        }
        body
    }
}

/// How an iteration ended, and how many HTTP requests it took.
pub(crate) struct Outcome {
    pub(crate) kind: Kind,
    pub(crate) requests: u64,
}

/// One op: `body` is [`Work::body`]'s.
pub(crate) async fn iteration(work: Work, s: &Session, url: &str, body: &Value) -> Outcome {
    let one = |kind| Outcome { kind, requests: 1 };
    match work {
        Work::Progress => one(match stream(s.post(url, body)).await {
            Ok(events) => streamed(&events).err().unwrap_or(Kind::Ok),
            Err(k) => k,
        }),
        Work::Blob => one(match s.exchange(url, body).await {
            Ok(m) => blob(&m),
            Err(k) => k,
        }),
        Work::Resume => resume(s, url, body).await,
        Work::Task => task(s, url, body).await,
    }
}

/// One SSE event: its id and its data (empty for the priming event).
#[derive(Debug)]
struct Event {
    id: Option<String>,
    data: String,
}

/// The events of an SSE body (comments skipped).
fn events(body: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    let (mut id, mut data, mut any) = (None, String::new(), false);
    for line in String::from_utf8_lossy(body).lines() {
        if line.is_empty() {
            if any {
                out.push(Event { id: id.take(), data: std::mem::take(&mut data) });
            }
            any = false;
        } else if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().to_owned());
            any = true;
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
            any = true;
        } else if line.starts_with("retry:") {
            any = true;
        }
    }
    if any {
        out.push(Event { id, data });
    }
    out
}

/// Sends the request and reads its SSE answer to the end.
async fn stream(rb: reqwest::RequestBuilder) -> Result<Vec<Event>, Kind> {
    let (sse, bytes) = crate::receive(rb).await?;
    if !sse {
        return Err(Kind::Wrong("a JSON answer, not SSE".to_owned()));
    }
    Ok(events(&bytes))
}

/// Checks the messages of a `bench_progress` stream: the notifications, then the answer.
fn streamed(events: &[Event]) -> Result<(), Kind> {
    let messages: Vec<Value> = events.iter().filter_map(|e| serde_json::from_str(&e.data).ok()).collect();
    let progress = messages.iter().filter(|m| m["method"] == "notifications/progress").count();
    let Some(answer) = messages.iter().find(|m| m.get("result").is_some() || m.get("error").is_some()) else {
        return Err(Kind::Wrong(format!("no answer after {progress} progress notifications")));
    };
    answered(answer)?;
    if progress != PROGRESS_COUNT {
        return Err(Kind::Wrong(format!("{progress} progress notifications, not {PROGRESS_COUNT}")));
    }
    match answer["result"]["content"][0]["text"].as_str() {
        Some(PROGRESS_TEXT) => Ok(()),
        _ => Err(Kind::Wrong("another answer".to_owned())),
    }
}

/// The kind of a response that is not a successful result.
fn answered(m: &Value) -> Result<(), Kind> {
    if m.get("error").is_some() {
        return Err(Kind::RpcError(m["error"]["code"].as_i64().unwrap_or(0)));
    }
    if m["result"]["isError"] == true {
        return Err(Kind::IsError);
    }
    Ok(())
}

fn blob(m: &Value) -> Kind {
    if let Err(k) = answered(m) {
        return k;
    }
    match m["result"]["content"][0]["text"].as_str().map(str::len) {
        Some(BLOB_BYTES) => Kind::Ok,
        Some(n) => Kind::Wrong(format!("{n} bytes, not {BLOB_BYTES}")),
        None => Kind::Wrong("no text".to_owned()),
    }
}

/// The call, then its replay from the priming event.
async fn resume(s: &Session, url: &str, body: &Value) -> Outcome {
    let kind = async {
        let events = stream(s.post(url, body)).await?;
        streamed(&events)?;
        let Some(Event { id: Some(cursor), data }) = events.first() else {
            return Err(Kind::Wrong("no priming event".to_owned()));
        };
        if !data.is_empty() {
            return Err(Kind::Wrong("the first event is a message, not the priming event".to_owned()));
        }
        let replayed = stream(s.resume(url, cursor)).await?;
        streamed(&replayed).map_err(|k| match k {
            Kind::Wrong(what) => Kind::Wrong(format!("replayed: {what}")),
            k => k,
        })
    };
    Outcome { kind: kind.await.err().unwrap_or(Kind::Ok), requests: 2 }
}

/// The task's creation, then its polls until it has its result.
async fn task(s: &Session, url: &str, call: &Value) -> Outcome {
    let mut requests = 1;
    let kind = async {
        let created = s.exchange(url, call).await?;
        answered(&created)?;
        let (Some("task"), Some(id)) = (created["result"]["resultType"].as_str(), created["result"]["taskId"].as_str())
        else {
            return Err(Kind::Wrong("no task created".to_owned()));
        };
        let get = json!({ "jsonrpc": "2.0", "id": 2, "method": "tasks/get",
            "params": { "taskId": id, "_meta": stateless_meta(true) } });
        let deadline = Instant::now() + TASK_DEADLINE;
        loop {
            requests += 1;
            let m = s.exchange(url, &get).await?;
            answered(&m)?;
            match m["result"]["status"].as_str() {
                Some("completed") => {
                    let result = &m["result"]["result"];
                    if result["isError"] == true {
                        return Err(Kind::IsError);
                    }
                    return match result["content"][0]["text"].as_str() {
                        Some(t) if !t.is_empty() => Ok(()),
                        _ => Err(Kind::Wrong("a completed task without its result".to_owned())),
                    };
                }
                Some(status @ ("failed" | "cancelled")) => return Err(Kind::TaskEnded(status.to_owned())),
                _ if Instant::now() > deadline => {
                    return Err(Kind::Wrong(format!("still working after {} s", TASK_DEADLINE.as_secs())));
                }
                _ => {}
            }
        }
    };
    let kind = kind.await.err().unwrap_or(Kind::Ok);
    Outcome { kind, requests }
}

impl Session {
    /// A GET of the endpoint that resumes a stream after `last_event_id`, in the session.
    fn resume(&self, url: &str, last_event_id: &str) -> reqwest::RequestBuilder {
        let mut rb = self
            .http
            .get(url)
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("last-event-id", last_event_id);
        if !self.id.is_empty() {
            rb = rb.header("mcp-session-id", &self.id);
        }
        if let Some(t) = &self.token {
            rb = rb.header("authorization", format!("Bearer {t}"));
        }
        rb
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_an_sse_body_and_keep_the_priming_event() {
        let body = b"id: 1:17-0\nretry: 1000\ndata: \n\n: keep-alive\n\nid: 1:17-1\ndata: {\"a\":1}\n\nid: 0/3\ndata: {\"b\":2}\n";
        let e = events(body);
        assert_eq!(e.len(), 3, "{e:?}");
        assert_eq!((e[0].id.as_deref(), e[0].data.as_str()), (Some("1:17-0"), ""));
        assert_eq!((e[1].id.as_deref(), e[1].data.as_str()), (Some("1:17-1"), "{\"a\":1}"));
        assert_eq!((e[2].id.as_deref(), e[2].data.as_str()), (Some("0/3"), "{\"b\":2}"));
    }

    #[test]
    fn a_progress_stream_needs_five_notifications_and_the_answer() {
        let note =
            |i: u32| format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progress":{i}}}}}"#);
        let answer = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{PROGRESS_TEXT}"}}]}}}}"#
        );
        let body = |n: u32| {
            let mut b = "id: p\nretry: 1\n\n".to_owned();
            for i in 1..=n {
                b.push_str(&format!("data: {}\n\n", note(i)));
            }
            b + &format!("data: {answer}\n\n")
        };
        assert!(streamed(&events(body(5).as_bytes())).is_ok());
        assert_eq!(
            streamed(&events(body(4).as_bytes())),
            Err(Kind::Wrong("4 progress notifications, not 5".to_owned()))
        );
        assert!(matches!(streamed(&events(b"id: p\n\n")), Err(Kind::Wrong(_))));
    }

    #[test]
    fn a_blob_is_exactly_64_kib() {
        let r = |n: usize| json!({ "result": { "content": [{ "type": "text", "text": "x".repeat(n) }] } });
        assert_eq!(blob(&r(65_536)), Kind::Ok);
        assert_eq!(blob(&r(65_535)), Kind::Wrong("65535 bytes, not 65536".to_owned()));
        assert_eq!(blob(&json!({ "error": { "code": -32602 } })), Kind::RpcError(-32602));
    }
}
