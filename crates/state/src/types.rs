use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use mcpfleet_core::UserKey;
use mcpfleet_core::is_token_char;

/// A session id as the client sends it in `MCP-Session-Id`. Ours are base64url, 16 to 128 characters; anything
/// else cannot name a session and is treated as unknown without a store call.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SessionId(String);

impl SessionId {
    #[must_use]
    pub fn parse(raw: &str) -> Option<Self> {
        (raw.len() >= 16 && raw.len() <= 128 && raw.bytes().all(is_token_char)).then(|| Self(raw.to_owned()))
    }
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SessionId {
    // Never print a whole session id: it is a bearer capability for its owner.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({}…)", &self.0[..6.min(self.0.len())])
    }
}

/// A session as seen by one user: the owner is part of the key, so another user's key names nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub user: UserKey,
    pub id: SessionId,
}

/// What `initialize` records.
#[derive(Clone, Debug)]
pub struct NewSession {
    pub protocol_version: String,
    /// The client's capabilities, as JSON.
    pub client_capabilities: String,
    pub idle_ttl: Duration,
}

/// A session DELETE ended: the protocol version it was opened with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedSession {
    pub protocol_version: String,
}

/// What a request needs to know about its session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub protocol_version: String,
    pub client_capabilities: String,
    pub log_level: Option<String>,
}

/// The id of one committed event: the stream it belongs to and its position in the session log.
/// On the wire it is `<stream>:<ms>-<seq>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId {
    pub stream: u64,
    pub ms: u64,
    pub seq: u64,
}

impl EventId {
    /// The log position alone, as Redis writes it.
    #[must_use]
    pub fn position(&self) -> String {
        format!("{}-{}", self.ms, self.seq)
    }

    pub(crate) fn from_position(stream: u64, pos: &str) -> Option<Self> {
        let (ms, seq) = pos.split_once('-')?;
        Some(Self { stream, ms: ms.parse().ok()?, seq: seq.parse().ok()? })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}-{}", self.stream, self.ms, self.seq)
    }
}

impl FromStr for EventId {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        if s.len() > 64 {
            return Err(());
        }
        let (stream, pos) = s.split_once(':').ok_or(())?;
        Self::from_position(stream.parse().map_err(|_| ())?, pos).ok_or(())
    }
}

/// One committed event. `data` is empty for a priming event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub id: EventId,
    pub data: String,
    pub is_final: bool,
}

/// Who holds the standalone stream: once a newer GET takes it over, renewals with an older token fail. (A POST
/// stream's number is unique in its session, so its number alone names its one holder.)
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseToken(pub String);

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(..)")
    }
}

/// Which stream to open.
#[derive(Clone, Debug)]
pub enum OpenStream {
    /// The SSE response to one POSTed request, whose JSON-RPC id (as JSON) is recorded so that a resumer can
    /// answer it if the replica running it dies.
    Post { request_id: String, token: LeaseToken, lease: Duration },
    /// The standalone GET stream; the newest holder wins.
    Standalone { token: LeaseToken, lease: Duration },
}

/// How to commit an event.
#[derive(Clone, Debug, Default)]
pub struct AppendOptions {
    /// This is the stream's last event (the response to its request).
    pub is_final: bool,
    /// The event is a server→client request with this id: record it as pending so the client's response can be
    /// routed back.
    pub pending_request: Option<String>,
    /// The W3C `traceparent` of the call waiting for that response, handed to whichever replica delivers it.
    pub pending_trace: Option<String>,
    /// Extends the stream's lease by this much.
    pub lease: Option<Duration>,
    /// The event's place in its POST stream (1, 2, …), counted by the stream's one writer, for a non-final event.
    /// It makes the append idempotent: an append whose place the stream has already reached writes nothing. If
    /// it is the stream's last event, its id is returned (a retry after a timeout learns the id of the write that
    /// landed); if a later one is, the append fails with [`StateError::Superseded`](crate::StateError). So a
    /// write that reaches the store after its writer gave up on it can never add a second copy.
    pub seq: Option<u64>,
}

/// The state of a POST stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamState {
    /// Its final event is committed (or it never existed).
    Finished,
    /// Its replica holds a live lease.
    Running,
    /// Its lease expired without a final event; the request id (JSON) it was answering.
    Abandoned { request_id: String },
}

/// What a session's doorbell carries between replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ring {
    /// An event was committed to this stream.
    Event(u64),
    /// A response to this server→client request was delivered.
    Response(String),
    /// The client cancelled this request (its JSON-RPC id, as JSON).
    Cancel(String),
    /// A new holder took over the standalone stream.
    Takeover(String),
    /// The session ended.
    Closed,
    /// A notification published to a principal's notice channel (JSON).
    Notice(String),
    /// Rings may have been lost (the subscriber reconnected or fell behind): re-check everything.
    Lagged,
}

impl Ring {
    #[cfg(test)]
    fn encode(&self) -> String {
        match self {
            Self::Event(k) => format!("e:{k}"),
            Self::Response(id) => format!("r:{id}"),
            Self::Cancel(id) => format!("c:{id}"),
            Self::Takeover(t) => format!("g:{t}"),
            Self::Closed => "x".to_owned(),
            Self::Notice(m) => format!("n:{m}"),
            Self::Lagged => "l".to_owned(),
        }
    }

    pub(crate) fn decode(s: &str) -> Option<Self> {
        if s == "x" {
            return Some(Self::Closed);
        }
        let (kind, rest) = s.split_once(':')?;
        Some(match kind {
            "e" => Self::Event(rest.parse().ok()?),
            "r" => Self::Response(rest.to_owned()),
            "c" => Self::Cancel(rest.to_owned()),
            "g" => Self::Takeover(rest.to_owned()),
            "n" => Self::Notice(rest.to_owned()),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_round_trip_and_reject_garbage() {
        let id = EventId { stream: 3, ms: 1_700_000_000_000, seq: 7 };
        assert_eq!(id.to_string().parse::<EventId>(), Ok(id));
        for bad in ["", "3", "3:", "x:1-2", "3:1", "3:1-", "-1:1-2", "3:1-2-3", "3:a-b"] {
            assert!(bad.parse::<EventId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn rings_round_trip() {
        for r in [
            Ring::Event(4),
            Ring::Response("s-1".into()),
            Ring::Cancel("\"a:b\"".into()),
            Ring::Closed,
            Ring::Notice("{\"a\":1}".into()),
        ] {
            assert_eq!(Ring::decode(&r.encode()), Some(r));
        }
    }

    #[test]
    fn keys_reject_tag_breaking_characters() {
        assert!(UserKey::new("abc{x}").is_none());
        assert!(UserKey::new("a:b").is_none());
        assert!(SessionId::parse("short").is_none());
        assert!(SessionId::parse("aaaaaaaaaaaaaaaa aaaa").is_none());
        assert!(SessionId::parse("AAAAAAAAAAAAAAAAAAAAAA-_").is_some());
    }
}

/// What [`Router::deliver_response`](crate::Router::deliver_response) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Stored for the waiting call, which was woken. `waiter_trace` is the `traceparent` it registered.
    Delivered { waiter_trace: Option<String> },
    /// No such request is pending in this session (answered already, timed out, forgotten, or never sent).
    NotPending,
}

impl Delivery {
    #[must_use]
    pub fn delivered(&self) -> bool {
        matches!(self, Self::Delivered { .. })
    }
}
