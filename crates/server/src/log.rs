//! Where log lines go, and how the JSON ones are written: a buffer that a writer thread empties to stderr every
//! few milliseconds, and a JSON event formatter that writes a line straight into it.
//!
//! Every `tools/call` logs two lines (the access line and the audit event), so their cost is part of the hot path
//! (issue 19, docs/BENCHMARKS.md). A request's thread appends its line to a shared buffer under a lock: no channel,
//! no wake-up of another thread and no `write(2)` per line; the writer thread writes what has gathered every
//! [`FLUSH_EVERY`], in one `write(2)`. It is not lossy: past [`HIGH_WATER`] buffered bytes the thread that logs
//! writes them itself, and waits for stderr like any writer would. Lines stay in order. A graceful stop (the
//! [`LogGuard`] dropped) and the second-signal exit ([`flush`]) write what is left; a crash can lose the last
//! [`FLUSH_EVERY`] of lines.
//!
//! [`Json`] writes the same lines as `tracing_subscriber`'s JSON format with `flatten_event(true)` (`timestamp`,
//! `level`, the fields in order, `target`), without building a map of the fields first; events inside a span go
//! to that formatter, which adds the span's fields. This module must not depend on the transport: it formats
//! whatever event it is given.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// How long a line may wait in the buffer before the writer thread writes it.
const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Past this many buffered bytes, the thread that logs writes them itself.
const HIGH_WATER: usize = 1 << 20;

struct Shared {
    buf: Mutex<Vec<u8>>,
    out: Mutex<Box<dyn std::io::Write + Send>>,
    stop: AtomicBool,
    /// [`HIGH_WATER`], or 0 when there is no writer thread (every line is written at once).
    high_water: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn append(&self, line: &[u8]) {
        let mut buf = lock(&self.buf);
        buf.extend_from_slice(line);
        if buf.len() >= self.high_water.load(Ordering::Relaxed) {
            self.drain(buf);
        }
    }

    /// Writes what is buffered. The output's lock is taken before the buffer's is let go, so whoever drains
    /// next writes after this.
    fn drain(&self, mut buf: MutexGuard<'_, Vec<u8>>) {
        if buf.is_empty() {
            return;
        }
        let mut out = lock(&self.out);
        let lines = std::mem::replace(&mut *buf, Vec::with_capacity(64 * 1024));
        drop(buf);
        // Nowhere to report a failing stderr; the lines are dropped as an unbuffered stderr would drop them.
        let _ = out.write_all(&lines).and_then(|()| out.flush());
    }
}

/// The writer the subscriber writes each formatted line to (one `write_all` per event).
#[derive(Clone)]
pub(crate) struct LogWriter(Arc<Shared>);

/// One event's line, on its way into the buffer.
pub(crate) struct Line<'a>(&'a Shared);

impl std::io::Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line(&self.0)
    }
}

/// Stops the writer thread and writes what is left, when dropped.
pub(crate) struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        self.shared.drain(lock(&self.shared.buf));
    }
}

/// The process's log buffer, for [`flush`].
static CURRENT: OnceLock<Weak<Shared>> = OnceLock::new();

/// Writes what is buffered now (before `std::process::exit`, which runs no destructor).
pub(crate) fn flush() {
    if let Some(shared) = CURRENT.get().and_then(Weak::upgrade) {
        shared.drain(lock(&shared.buf));
    }
}

/// A buffered writer to `out`, and the guard that stops its writer thread.
pub(crate) fn buffered(out: Box<dyn std::io::Write + Send>) -> (LogWriter, LogGuard) {
    let shared = Arc::new(Shared {
        buf: Mutex::new(Vec::with_capacity(64 * 1024)),
        out: Mutex::new(out),
        stop: false.into(),
        high_water: HIGH_WATER.into(),
    });
    let s = shared.clone();
    let thread = std::thread::Builder::new().name("mcpfleet-log".to_owned()).spawn(move || {
        while !s.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(FLUSH_EVERY);
            s.drain(lock(&s.buf));
        }
    });
    if thread.is_err() {
        // No writer thread: every line is written at once.
        shared.high_water.store(0, Ordering::Relaxed);
    }
    let _ = CURRENT.set(Arc::downgrade(&shared));
    (LogWriter(shared.clone()), LogGuard { shared, thread: thread.ok() })
}

/// The JSON event format: `tracing_subscriber`'s, flattened, written field by field.
pub(crate) struct Json {
    /// For events inside a span.
    spans: format::Format<format::Json>,
}

impl Json {
    pub(crate) fn new() -> Self {
        Self { spans: format::format().json().flatten_event(true) }
    }
}

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        if event.parent().is_some() || ctx.lookup_current().is_some() {
            return self.spans.format_event(ctx, w, event);
        }
        let meta = event.metadata();
        w.write_str("{\"timestamp\":\"")?;
        timestamp(&mut w)?;
        w.write_str("\",\"level\":\"")?;
        w.write_str(meta.level().as_str())?;
        w.write_char('"')?;
        let mut fields = Fields { w: &mut w, result: Ok(()) };
        event.record(&mut fields);
        fields.result?;
        w.write_str(",\"target\":")?;
        string(&mut w, meta.target())?;
        w.write_str("}\n")
    }
}

/// The time as the stock format's timer writes it (`2026-12-02T06:04:29.717547Z`), with the part up to the second
/// formatted by that timer once a second per thread, not on every line.
fn timestamp(w: &mut Writer<'_>) -> std::fmt::Result {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (secs, micros) = (now.as_secs(), now.subsec_micros());
    SECOND.with_borrow_mut(|(at, upto)| {
        if *at != secs {
            let mut full = String::with_capacity(32);
            SystemTime.format_time(&mut Writer::new(&mut full))?;
            // "…:SS.ffffffZ": the timer read the clock after us, so at a second's end it may be in the next one;
            // then its own line is written, and nothing is kept.
            let cut = full.len().saturating_sub(7);
            let second = full.get(cut.saturating_sub(3)..cut.saturating_sub(1)).and_then(|ss| ss.parse::<u64>().ok());
            if second != Some(secs % 60) {
                return w.write_str(&full);
            }
            full.truncate(cut);
            (*at, *upto) = (secs, full);
        }
        w.write_str(upto)?;
        let mut digits = *b"000000Z";
        let mut n = micros;
        for d in digits[..6].iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
        w.write_str(std::str::from_utf8(&digits).map_err(|_| std::fmt::Error)?)
    })
}

/// Writes each field as `,"name":value`.
struct Fields<'a, 'w> {
    w: &'a mut Writer<'w>,
    result: std::fmt::Result,
}

impl Fields<'_, '_> {
    fn field(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> std::fmt::Result) {
        if self.result.is_ok() {
            self.result = self
                .w
                .write_char(',')
                .and_then(|()| string(self.w, field.name()))
                .and_then(|()| self.w.write_char(':'))
                .and_then(|()| value(self.w));
        }
    }
}

impl Visit for Fields<'_, '_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        // As serde_json: a number, or null for what JSON cannot say.
        self.field(field, |w| if value.is_finite() { write!(w, "{value}") } else { w.write_str("null") });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, |w| string(w, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.field(field, |w| {
            w.write_char('"')?;
            write!(Escaped(w), "{value:?}")?;
            w.write_char('"')
        });
    }
}

/// A JSON string, quoted and escaped as serde_json escapes it.
fn string(w: &mut Writer<'_>, s: &str) -> std::fmt::Result {
    w.write_char('"')?;
    Escaped(w).write_str(s)?;
    w.write_char('"')
}

/// Escapes what goes through it for the inside of a JSON string: `"`, `\` and the control characters.
struct Escaped<'a, 'w>(&'a mut Writer<'w>);

impl std::fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let bytes = s.as_bytes();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            // Eight bytes at a time while none of them needs escaping, which is nearly always (ids, names, hashes).
            if let Some(chunk) = bytes.get(i..i + 8).and_then(|c| <[u8; 8]>::try_from(c).ok())
                && !any_to_escape(u64::from_le_bytes(chunk))
            {
                i += 8;
                continue;
            }
            let b = bytes[i];
            let esc = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..0x20 => "",
                _ => {
                    i += 1;
                    continue;
                }
            };
            self.0.write_str(&s[start..i])?;
            if esc.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(esc)?;
            }
            i += 1;
            start = i;
        }
        self.0.write_str(&s[start..])
    }
}

/// Whether any of eight bytes is `"`, `\` or below 0x20 (the bit tricks of "Bit Twiddling Hacks": a byte below
/// n, a byte equal to zero). Bytes of 0x80 and up, UTF-8's multi-byte sequences, never match.
fn any_to_escape(x: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |v: u64, n: u64| v.wrapping_sub(ONES * n) & !v & HIGH;
    let quote = x ^ (ONES * u64::from(b'"'));
    let backslash = x ^ (ONES * u64::from(b'\\'));
    (below(x, 0x20) | below(quote, 1) | below(backslash, 1)) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines `emit` logs, through `format`.
    fn lines(json: bool, emit: impl FnOnce()) -> String {
        let sink = Sink::default();
        let out = sink.clone();
        let make = move || out.clone();
        if json {
            let layer = tracing_subscriber::fmt::layer().json().event_format(Json::new()).with_writer(make);
            tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), emit);
        } else {
            let layer = tracing_subscriber::fmt::layer().json().flatten_event(true).with_writer(make);
            tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), emit);
        }
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    fn emit() {
        let e = std::io::Error::other("disk \"full\"\n\u{1}");
        tracing::info!(
            target: "mcpfleet::access",
            request_id = %"r-1",
            status = 200u16,
            latency_ms = 0.125_787_999_999_999_98,
            nan = f64::NAN,
            neg = -3i64,
            ok = true,
            text = "tab\there \\ ünïcode",
            debug = ?Some("x"),
            error = &e as &(dyn std::error::Error + 'static),
            "request"
        );
        tracing::warn!("a message with \"quotes\"");
        let span = tracing::info_span!("outer", id = 7);
        span.in_scope(|| tracing::info!(inside = 1, "in a span"));
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them_at_every_offset() {
        for len in 0..20 {
            for at in 0..=len {
                for special in ["\"", "\\", "\n", "\u{1}", "\u{1f}", "\u{7f}", "é", "\u{10348}", " "] {
                    let mut s = "a".repeat(len);
                    s.insert_str(at, special);
                    let mut out = String::new();
                    string(&mut Writer::new(&mut out), &s).unwrap();
                    assert_eq!(out, serde_json::to_string(&s).unwrap(), "{s:?}");
                }
            }
        }
    }

    #[test]
    fn the_timestamp_is_the_stock_timers_to_the_second() {
        for _ in 0..3 {
            let (mut ours, mut theirs) = (String::new(), String::new());
            timestamp(&mut Writer::new(&mut ours)).unwrap();
            SystemTime.format_time(&mut Writer::new(&mut theirs)).unwrap();
            assert_eq!(ours.len(), theirs.len(), "{ours} {theirs}");
            assert!(ours.ends_with('Z') && ours[20..26].bytes().all(|b| b.is_ascii_digit()), "{ours}");
            if ours[..20] == theirs[..20] {
                return;
            }
        }
        panic!("the timestamp's seconds differ from the stock timer's three times in a row");
    }

    #[test]
    fn writes_what_the_json_format_writes() {
        let ours = lines(true, emit);
        let theirs = lines(false, emit);
        let parse = |s: &str| -> Vec<serde_json::Value> {
            s.lines()
                .map(|l| {
                    let mut v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
                    v.as_object_mut().unwrap().remove("timestamp");
                    v
                })
                .collect()
        };
        assert_eq!(parse(&ours), parse(&theirs), "\nours:   {ours}\ntheirs: {theirs}");
        // The same keys in the same order, not only the same values.
        let keys = |s: &str| {
            s.lines().next().unwrap().split("\":").map(|k| k.rsplit('"').next().unwrap().to_owned()).collect::<Vec<_>>()
        };
        assert_eq!(keys(&ours), keys(&theirs));
        let first: serde_json::Value = serde_json::from_str(ours.lines().next().unwrap()).unwrap();
        let ts = first["timestamp"].as_str().unwrap();
        assert_eq!((ts.len(), &ts[4..5], &ts[10..11], &ts[26..]), (27, "-", "T", "Z"), "{ts}");
        assert!(ours.lines().nth(2).unwrap().contains("\"spans\""), "an event in a span keeps its spans: {ours}");
    }

    #[test]
    fn the_buffer_keeps_every_line_in_order_and_the_guard_writes_the_rest() {
        let sink = Sink::default();
        let (writer, guard) = buffered(Box::new(sink.clone()));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..5000 {
                        // Past the high-water mark now and then: the logging thread writes.
                        let pad = if i % 1000 == 0 { "x".repeat(HIGH_WATER / 2) } else { String::new() };
                        // One write per line, as the subscriber writes a formatted event.
                        w.make_writer().write_all(format!("{t} {i} {pad}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let mut next = [0; 4];
        for l in text.lines() {
            let mut parts = l.split(' ');
            let t: usize = parts.next().unwrap().parse().unwrap();
            let i: usize = parts.next().unwrap().parse().unwrap();
            assert_eq!(i, next[t], "thread {t}'s lines in order");
            next[t] += 1;
        }
        assert_eq!(next, [5000; 4], "no line lost");
    }
}
