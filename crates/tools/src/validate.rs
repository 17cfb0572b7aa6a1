//! Validation of a call's raw arguments against the exact input schema its tool publishes, before anything runs.
//! Each schema is compiled once, at start-up (JSON Schema 2020-12, format assertions on). On top of the schema,
//! every string obeys the text policy:
//! - a byte budget: `x-maxBytes` when the schema declares it, else 4 × `maxLength` (jsonschema counts code points);
//! - no C0 or C1 control character, DEL, bidi override or isolate, or tag character, unless the string's schema
//!   says `"x-allowControls": true`, which admits tab, line feed and carriage return (and nothing else);
//! - no invisible format character that carries no meaning in text (zero-width space, word joiner and the
//!   invisible operators, byte-order mark, soft hyphen, bidi marks, interlinear annotation, deprecated format
//!   controls), unless the string's schema says `"x-allowFormatChars": true`. Zero-width non-joiner and joiner
//!   (U+200C, U+200D) are always allowed: Persian, Indic scripts and emoji sequences need them.
//!
//! Numbers are normalised before validation ([`Validator::normalize_arguments`]): JSON Schema counts `1.0` and
//! `-0` as integers, so where a tool's schema says `integer`, an integral number is rewritten as the integer,
//! and what the published schema accepts, the handler's typed arguments accept too.
//!
//! Duplicate keys never reach the schema unseen: a `serde_json::Value` keeps the last one silently, so requests are
//! parsed with [`parse_strict`], which reports the first one in the same pass. What a refusal says ([`Invalid`]) names the JSON pointer and what was
//! expected, never the value sent.

use jsonschema::error::ValidationErrorKind;
use jsonschema::{Keyword, ValidationError};
pub use mcpfleet_core::parse_strict;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::fmt;

/// The keyword the validator adds to every string schema of its compiled copy.
const TEXT_KEYWORD: &str = "x-mcpfleet-text";
/// At most this many findings are reported per call.
const MAX_FINDINGS: usize = 5;

/// One reason a call's arguments are refused: where, and what was expected. Safe to show the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Invalid {
    /// A JSON pointer from the call's `params`, e.g. `/arguments/limit`.
    pub pointer: String,
    pub expected: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.pointer, self.expected)
    }
}

/// How every schema of a tool is compiled (input and output): JSON Schema 2020-12 with format assertions on; the
/// `format`s schemars emits that JSON Schema does not define are known too, as checks of a string (the only
/// instance a format applies to): `ip` (either family), and `int8`…`int128`, `uint8`…`uint128`, `int`, `uint`,
/// `float`, `double` (a number in that range, written as a string); on a number they assert nothing. A `format`
/// that is neither refuses the schema, so that nothing a tool publishes goes unenforced.
#[must_use]
pub fn options<'i>() -> jsonschema::ValidationOptions<'i> {
    fn parses<T: std::str::FromStr>(s: &str) -> bool {
        s.parse::<T>().is_ok()
    }
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .should_ignore_unknown_formats(false)
        .with_format("ip", parses::<std::net::IpAddr>)
        .with_format("int8", parses::<i8>)
        .with_format("int16", parses::<i16>)
        .with_format("int32", parses::<i32>)
        .with_format("int64", parses::<i64>)
        .with_format("int128", parses::<i128>)
        .with_format("int", parses::<i64>)
        .with_format("uint8", parses::<u8>)
        .with_format("uint16", parses::<u16>)
        .with_format("uint32", parses::<u32>)
        .with_format("uint64", parses::<u64>)
        .with_format("uint128", parses::<u128>)
        .with_format("uint", parses::<u64>)
        .with_format("float", parses::<f32>)
        .with_format("double", parses::<f64>)
}

/// The compiled input schemas of a catalog's tools.
pub struct Validator {
    tools: HashMap<String, jsonschema::Validator>,
    /// The `x-mcp-header` parameters of each tool that has any.
    headers: HashMap<String, Vec<crate::headers::ParamHeader>>,
    /// Where each tool's schema allows an integer (tools without any are absent).
    integers: HashMap<String, Shape>,
}

impl fmt::Debug for Validator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Validator").field("tools", &self.tools.len()).finish()
    }
}

impl Validator {
    /// Compiles the `inputSchema` of every `tools/list` entry.
    ///
    /// # Errors
    /// A tool without a name or whose schema does not compile: the message names it.
    pub fn new(tools: &[Value]) -> Result<Self, String> {
        let mut compiled = HashMap::new();
        let mut headers = HashMap::new();
        let mut integers = HashMap::new();
        for t in tools {
            let name = t.get("name").and_then(Value::as_str).ok_or("a tool without a name")?;
            let schema = t.get("inputSchema").ok_or_else(|| format!("{name}: no inputSchema"))?;
            let h = crate::headers::param_headers(schema)
                .map_err(|o| format!("{name}: invalid x-mcp-header at {}: {}", o[0].0, o[0].1))?;
            if !h.is_empty() {
                headers.insert(name.to_owned(), h);
            }
            let v = options()
                .with_keyword(TEXT_KEYWORD, text_keyword)
                .build(&with_text_policy(schema))
                .map_err(|e| format!("{name}: the input schema does not compile: {e}"))?;
            compiled.insert(name.to_owned(), v);
            let shape = Shape::of(schema, schema, 0);
            if shape.has_int() {
                integers.insert(name.to_owned(), shape);
            }
        }
        Ok(Self { tools: compiled, headers, integers })
    }

    /// An empty validator (no tools).
    #[must_use]
    pub fn empty() -> Self {
        Self { tools: HashMap::new(), headers: HashMap::new(), integers: HashMap::new() }
    }

    /// Rewrites the integral numbers of a `tools/call`'s `params.arguments` (`1.0`, `-0`, `1e2`) as integers
    /// wherever the tool's schema allows an integer, so that validation, the argument digests (idempotency,
    /// `requestState`), the `Mcp-Param-*` comparison and the handler all see the same value. A number that is not
    /// integral, or outside the 64-bit integers, is left as sent (the schema then decides).
    pub fn normalize_arguments(&self, params: &mut Map<String, Value>) {
        let Some(shape) = params.get("name").and_then(Value::as_str).and_then(|n| self.integers.get(n)) else {
            return;
        };
        if let Some(args) = params.get_mut("arguments") {
            shape.normalize(args);
        }
    }

    /// The parameters of `tool` mirrored into `Mcp-Param-*` headers (`x-mcp-header`).
    #[must_use]
    pub fn param_headers(&self, tool: &str) -> &[crate::headers::ParamHeader] {
        self.headers.get(tool).map_or(&[], Vec::as_slice)
    }

    #[must_use]
    pub fn knows(&self, tool: &str) -> bool {
        self.tools.contains_key(tool)
    }

    /// Checks `args` (the call's `params.arguments`) against `tool`'s schema. A tool this validator does not
    /// know passes (the catalog refuses it as unknown).
    ///
    /// # Errors
    /// Up to five [`Invalid`] findings, in the order the schema reported them.
    pub fn check(&self, tool: &str, args: &Value) -> Result<(), Vec<Invalid>> {
        let Some(v) = self.tools.get(tool) else { return Ok(()) };
        if v.is_valid(args) {
            return Ok(());
        }
        let mut seen = HashSet::new();
        let found: Vec<Invalid> = v
            .iter_errors(args)
            .map(|e| Invalid { pointer: format!("/arguments{}", e.instance_path().as_str()), expected: expected(&e) })
            .filter(|i| seen.insert(i.clone()))
            .take(MAX_FINDINGS)
            .collect();
        if found.is_empty() {
            // is_valid and iter_errors disagree only for a keyword bug: still refuse.
            return Err(vec![Invalid { pointer: "/arguments".to_owned(), expected: "valid arguments".to_owned() }]);
        }
        Err(found)
    }
}

/// `key` escaped as one token of a JSON pointer (RFC 6901).
#[must_use]
pub fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Where a document (a policy, a downstreams document) is refused and what was expected there: the JSON pointer of
/// the place, and for an unknown key the pointer of the key itself with "no such key here".
#[must_use]
pub fn refusal(e: &ValidationError<'_>) -> (String, String) {
    let pointer = e.instance_path().as_str().to_owned();
    if let ValidationErrorKind::AdditionalProperties { unexpected } = e.kind()
        && let Some(key) = unexpected.first()
    {
        return (format!("{pointer}/{}", pointer_token(key)), "no such key here".to_owned());
    }
    (pointer, expected(e))
}

/// What a refused keyword expected, in words, without echoing the instance (also how the policy document's schema
/// refusals read).
#[must_use]
pub fn expected(e: &ValidationError<'_>) -> String {
    let names = |v: &[String]| {
        v.iter().take(5).map(|n| Value::String(n.chars().take(64).collect()).to_string()).collect::<Vec<_>>().join(", ")
    };
    match e.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            format!("no other properties (unexpected: {})", names(unexpected))
        }
        ValidationErrorKind::PropertyNames { error } => format!("every key {}", expected(error)),
        ValidationErrorKind::Required { property } => format!("the required property {property}"),
        ValidationErrorKind::Type { kind } => match kind {
            jsonschema::error::TypeKind::Single(t) => format!("a value of type {t}"),
            jsonschema::error::TypeKind::Multiple(ts) => format!("a value of one of the types {ts:?}"),
        },
        ValidationErrorKind::MaxLength { limit } => format!("at most {limit} characters"),
        ValidationErrorKind::MinLength { limit } => format!("at least {limit} characters"),
        ValidationErrorKind::Maximum { limit } => format!("at most {limit}"),
        ValidationErrorKind::Minimum { limit } => format!("at least {limit}"),
        ValidationErrorKind::ExclusiveMaximum { limit } => format!("less than {limit}"),
        ValidationErrorKind::ExclusiveMinimum { limit } => format!("more than {limit}"),
        ValidationErrorKind::MaxItems { limit } => format!("at most {limit} items"),
        ValidationErrorKind::MinItems { limit } => format!("at least {limit} items"),
        ValidationErrorKind::Enum { options } => format!("one of {options}"),
        ValidationErrorKind::Constant { expected_value } => format!("exactly {expected_value}"),
        ValidationErrorKind::Pattern { pattern } => format!("a string matching {pattern}"),
        ValidationErrorKind::Format { format } => format!("a valid {format}"),
        ValidationErrorKind::OneOfNotValid { .. } => "exactly one of the alternatives (none matches)".to_owned(),
        ValidationErrorKind::OneOfMultipleValid { .. } => {
            "exactly one of the alternatives (more than one matches: do not mix them)".to_owned()
        }
        ValidationErrorKind::AnyOf { .. } => "one of the alternatives".to_owned(),
        ValidationErrorKind::Custom { message, .. } => message.clone(),
        ValidationErrorKind::FalseSchema => "nothing here".to_owned(),
        ValidationErrorKind::UniqueItems => "unique items".to_owned(),
        _ => "a value that matches the schema".to_owned(),
    }
}

/// A copy of `schema` in which every string schema also carries the text policy keyword.
fn with_text_policy(schema: &Value) -> Value {
    match schema {
        Value::Object(m) => {
            let mut out: Map<String, Value> = m.iter().map(|(k, v)| (k.clone(), with_text_policy_at(k, v))).collect();
            let is_string = match m.get("type") {
                Some(Value::String(t)) => t == "string",
                Some(Value::Array(a)) => a.iter().any(|t| t == "string"),
                _ => false,
            };
            if is_string {
                let bytes = m
                    .get("x-maxBytes")
                    .and_then(Value::as_u64)
                    .or_else(|| m.get("maxLength").and_then(Value::as_u64).map(|n| n.saturating_mul(4)));
                let controls = m.get("x-allowControls").and_then(Value::as_bool).unwrap_or(false);
                let format = m.get("x-allowFormatChars").and_then(Value::as_bool).unwrap_or(false);
                out.insert(
                    TEXT_KEYWORD.to_owned(),
                    serde_json::json!({ "maxBytes": bytes, "allowControls": controls, "allowFormat": format }),
                );
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(with_text_policy).collect()),
        other => other.clone(),
    }
}

/// Keywords whose values are data (not subschemas) are copied as they are.
fn with_text_policy_at(key: &str, v: &Value) -> Value {
    match key {
        "enum" | "const" | "default" | "examples" | "required" => v.clone(),
        _ => with_text_policy(v),
    }
}

struct TextPolicy {
    max_bytes: Option<u64>,
    allow_controls: bool,
    allow_format: bool,
}

#[expect(clippy::unnecessary_wraps, reason = "the signature jsonschema's keyword factories have")]
fn text_keyword<'a>(
    _parent: &'a Map<String, Value>,
    value: &'a Value,
    _path: jsonschema::paths::Location,
) -> Result<Box<dyn for<'i> Keyword<'i>>, ValidationError<'a>> {
    Ok(Box::new(TextPolicy {
        max_bytes: value.get("maxBytes").and_then(Value::as_u64),
        allow_controls: value.get("allowControls").and_then(Value::as_bool).unwrap_or(false),
        allow_format: value.get("allowFormat").and_then(Value::as_bool).unwrap_or(false),
    }))
}

/// A character the text policy refuses: controls (C0, DEL, C1), bidi overrides and isolates, tag characters.
#[must_use]
pub fn forbidden_char(c: char, allow_controls: bool) -> bool {
    match c {
        '\t' | '\n' | '\r' => !allow_controls,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => true,
        '\u{e0000}'..='\u{e007f}' => true,
        _ => false,
    }
}

/// An invisible format character (Unicode category Cf) that carries no meaning in text, which the text policy
/// refuses unless a field opts in with `"x-allowFormatChars": true`: soft hyphen, Arabic letter mark, zero-width
/// space, left-to-right and right-to-left marks, word joiner and the invisible operators (U+2060–U+2064), the
/// deprecated format controls (U+206A–U+206F), the byte-order mark / zero-width no-break space, and the
/// interlinear annotation characters. Not U+200C or U+200D (zero-width non-joiner and joiner), which Persian,
/// Indic scripts and emoji sequences need, and not the format characters of particular scripts that render
/// visibly (Arabic number signs, Egyptian hieroglyph and shorthand format controls).
#[must_use]
pub fn invisible_format_char(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{200b}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2060}'..='\u{2064}'
            | '\u{206a}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

impl TextPolicy {
    fn problem(&self, s: &str) -> Option<String> {
        if let Some(max) = self.max_bytes
            && s.len() as u64 > max
        {
            return Some(format!("at most {max} bytes of UTF-8"));
        }
        s.chars()
            .position(|c| forbidden_char(c, self.allow_controls) || (!self.allow_format && invisible_format_char(c)))
            .map(|i| {
                format!(
                    "text without control, bidi-override, invisible format or tag characters (one at character {i})"
                )
            })
    }
}

impl<'i> Keyword<'i> for TextPolicy {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        match instance.as_str().and_then(|s| self.problem(s)) {
            Some(p) => Err(ValidationError::custom(p)),
            None => Ok(()),
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        instance.as_str().is_none_or(|s| self.problem(s).is_none())
    }
}

/// Where a schema allows an integer: the union over its compositions (`allOf`, `anyOf`, `oneOf`, `if`/`then`/
/// `else`) and local `$ref`s, so a value is normalised if any branch could take it as an integer (harmless for
/// the others: to JSON Schema, `1.0` and `1` are the same number).
#[derive(Debug, Default)]
struct Shape {
    int: bool,
    properties: HashMap<String, Shape>,
    /// `additionalProperties`, `unevaluatedProperties` and `patternProperties`, merged.
    other_properties: Option<Box<Shape>>,
    prefix_items: Vec<Shape>,
    items: Option<Box<Shape>>,
}

/// How deep `$ref`s and nesting are followed when a shape is built (a recursive schema stops there).
const SHAPE_DEPTH: usize = 32;

impl Shape {
    fn of(schema: &Value, root: &Value, depth: usize) -> Self {
        let mut shape = Self::default();
        shape.add(schema, root, depth);
        shape
    }

    fn add(&mut self, schema: &Value, root: &Value, depth: usize) {
        let Some(m) = schema.as_object().filter(|_| depth < SHAPE_DEPTH) else { return };
        match m.get("type") {
            Some(Value::String(t)) if t == "integer" => self.int = true,
            Some(Value::Array(ts)) if ts.iter().any(|t| t == "integer") => self.int = true,
            _ => {}
        }
        if let Some(Value::Object(props)) = m.get("properties") {
            for (k, v) in props {
                self.properties.entry(k.clone()).or_default().add(v, root, depth + 1);
            }
        }
        for key in ["additionalProperties", "unevaluatedProperties"] {
            if let Some(v @ Value::Object(_)) = m.get(key) {
                self.other_properties.get_or_insert_default().add(v, root, depth + 1);
            }
        }
        if let Some(Value::Object(patterns)) = m.get("patternProperties") {
            for v in patterns.values() {
                self.other_properties.get_or_insert_default().add(v, root, depth + 1);
            }
        }
        if let Some(Value::Array(prefix)) = m.get("prefixItems") {
            for (i, v) in prefix.iter().enumerate() {
                if self.prefix_items.len() <= i {
                    self.prefix_items.push(Self::default());
                }
                self.prefix_items[i].add(v, root, depth + 1);
            }
        }
        if let Some(v @ Value::Object(_)) = m.get("items") {
            self.items.get_or_insert_default().add(v, root, depth + 1);
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = m.get(key) {
                for b in branches {
                    self.add(b, root, depth + 1);
                }
            }
        }
        for key in ["then", "else"] {
            if let Some(b) = m.get(key) {
                self.add(b, root, depth + 1);
            }
        }
        if let Some(b) =
            m.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')).and_then(|t| root.pointer(t))
        {
            self.add(b, root, depth + 1);
        }
    }

    fn has_int(&self) -> bool {
        self.int
            || self.properties.values().any(Self::has_int)
            || self.other_properties.as_ref().is_some_and(|s| s.has_int())
            || self.prefix_items.iter().any(Self::has_int)
            || self.items.as_ref().is_some_and(|s| s.has_int())
    }

    fn normalize(&self, v: &mut Value) {
        match v {
            Value::Number(n) if self.int && !(n.is_i64() || n.is_u64()) => {
                if let Some(i) = n.as_f64().and_then(integral) {
                    *v = i;
                }
            }
            Value::Object(o) => {
                for (k, x) in o.iter_mut() {
                    if let Some(s) = self.properties.get(k).or(self.other_properties.as_deref()) {
                        s.normalize(x);
                    }
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter_mut().enumerate() {
                    if let Some(s) = self.prefix_items.get(i).or(self.items.as_deref()) {
                        s.normalize(x);
                    }
                }
            }
            _ => {}
        }
    }
}

/// `f` as a JSON integer, if it is one exactly (`-0.0` is `0`).
fn integral(f: f64) -> Option<Value> {
    if f.fract() != 0.0 || !f.is_finite() {
        return None;
    }
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "checked to be integral and in range")]
    if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
        Some(Value::from(f as u64))
    } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
        Some(Value::from(f as i64))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(schema: Value) -> Validator {
        Validator::new(&[json!({ "name": "t", "inputSchema": schema })]).unwrap()
    }

    fn refusals(v: &Validator, args: Value) -> Vec<String> {
        v.check("t", &args).err().unwrap_or_default().iter().map(ToString::to_string).collect()
    }

    fn normalized(v: &Validator, args: &str) -> String {
        let mut params = json!({ "name": "t", "arguments": serde_json::from_str::<Value>(args).unwrap() });
        v.normalize_arguments(params.as_object_mut().unwrap());
        params["arguments"].to_string()
    }

    #[test]
    fn integral_numbers_become_integers_where_the_schema_says_integer() {
        let v = tool(json!({
            "type": "object", "additionalProperties": false,
            "$defs": { "n": { "type": "integer", "minimum": -5, "maximum": 5 } },
            "properties": {
                "i": { "type": "integer", "minimum": -5, "maximum": 5 },
                "f": { "type": "number", "minimum": -5, "maximum": 5 },
                "r": { "$ref": "#/$defs/n" },
                "a": { "type": "array", "maxItems": 3, "items": { "type": "integer", "minimum": 0, "maximum": 9 } },
                "t": { "type": "array", "maxItems": 2, "prefixItems": [{ "type": "string", "maxLength": 3 }, { "type": ["integer", "null"], "minimum": 0, "maximum": 9 }] },
                "o": { "type": "object", "maxProperties": 3, "additionalProperties": { "type": "integer", "minimum": 0, "maximum": 9 } },
                "u": { "oneOf": [{ "type": "integer", "minimum": 0, "maximum": 9 }, { "type": "string", "maxLength": 3 }] }
            }
        }));
        assert_eq!(
            normalized(&v, r#"{"i":1.0,"f":1.0,"r":-0,"a":[2.0,3,4.5],"t":["x",7.0],"o":{"k":1e0},"u":2.0}"#),
            r#"{"a":[2,3,4.5],"f":1.0,"i":1,"o":{"k":1},"r":0,"t":["x",7],"u":2}"#
        );
        assert!(refusals(&v, serde_json::from_str(r#"{"i":1,"r":0}"#).unwrap()).is_empty());
        // Not integral, or not a number: left for the schema to refuse.
        assert_eq!(normalized(&v, r#"{"i":1.5,"r":"1"}"#), r#"{"i":1.5,"r":"1"}"#);
        // Huge integral numbers outside the 64-bit integers stay as sent.
        assert_eq!(normalized(&v, r#"{"i":1e300}"#), r#"{"i":1e+300}"#);
    }

    #[test]
    fn invisible_format_characters_are_refused_unless_the_field_opts_in() {
        let v = tool(json!({ "type": "object", "additionalProperties": false, "properties": {
            "s": { "type": "string", "maxLength": 20 },
            "raw": { "type": "string", "maxLength": 20, "x-allowFormatChars": true } } }));
        for c in ['\u{200b}', '\u{2060}', '\u{feff}', '\u{ad}', '\u{200e}', '\u{2062}', '\u{fffb}'] {
            let r = refusals(&v, json!({ "s": format!("eu{c}west") }));
            assert!(r.iter().any(|m| m.contains("invisible format") && m.contains("character 2")), "{c:?}: {r:?}");
            assert!(refusals(&v, json!({ "raw": format!("eu{c}west") })).is_empty(), "{c:?} opted in");
        }
        // ZWNJ and ZWJ are text: Persian, Indic scripts, emoji sequences.
        for ok in ["می\u{200c}خواهم", "क्\u{200d}ष", "👩\u{200d}💻"] {
            assert!(refusals(&v, json!({ "s": ok })).is_empty(), "{ok:?}");
        }
        // Opting in to format characters does not let controls, bidi overrides or tags through.
        for bad in ["a\u{202e}b", "a\u{0}b", "a\u{e0041}b"] {
            assert!(!refusals(&v, json!({ "raw": bad })).is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn refusals_name_the_pointer_and_what_was_expected() {
        let v = tool(json!({
            "type": "object",
            "properties": {
                "q": { "type": "string", "minLength": 1, "maxLength": 5 },
                "n": { "type": "integer", "minimum": 1, "maximum": 20 },
                "f": { "type": "string", "enum": ["csv", "json"] },
                "when": { "type": "string", "format": "date", "maxLength": 10 },
                "inner": { "type": "object", "properties": { "a": { "type": "boolean" } }, "additionalProperties": false },
            },
            "required": ["q"],
            "additionalProperties": false,
        }));
        assert_eq!(v.check("t", &json!({ "q": "ok", "n": 3, "f": "csv", "when": "2026-11-30" })), Ok(()));
        assert_eq!(refusals(&v, json!({ "q": "toolong" })), ["/arguments/q: at most 5 characters"]);
        assert_eq!(refusals(&v, json!({ "q": "a", "n": 21 })), ["/arguments/n: at most 20"]);
        assert_eq!(refusals(&v, json!({ "q": "a", "n": "3" })), ["/arguments/n: a value of type integer"]);
        assert_eq!(refusals(&v, json!({ "q": "a", "n": 1.5 })), ["/arguments/n: a value of type integer"]);
        assert_eq!(refusals(&v, json!({ "q": "a", "f": "xml" })), [r#"/arguments/f: one of ["csv","json"]"#]);
        assert_eq!(refusals(&v, json!({})), [r#"/arguments: the required property "q""#]);
        assert_eq!(refusals(&v, json!({ "q": "a", "when": "yesterday" })), ["/arguments/when: a valid date"]);
        assert_eq!(
            refusals(&v, json!({ "q": "a", "user_id": "someone-else" })),
            [r#"/arguments: no other properties (unexpected: "user_id")"#]
        );
        assert_eq!(
            refusals(&v, json!({ "q": "a", "inner": { "a": true, "admin": true } })),
            [r#"/arguments/inner: no other properties (unexpected: "admin")"#]
        );
        // The value sent is never echoed.
        let r = refusals(&v, json!({ "q": "SECRET-VALUE" })).join(" ");
        assert!(!r.contains("SECRET"), "{r}");
    }

    #[test]
    fn strings_are_capped_by_bytes_and_refuse_invisible_tricks() {
        let v = tool(json!({
            "type": "object",
            "properties": {
                "id": { "type": "string", "maxLength": 8, "x-maxBytes": 8 },
                "text": { "type": "string", "maxLength": 100 },
                "note": { "type": "string", "maxLength": 100, "x-allowControls": true },
            },
            "additionalProperties": false,
        }));
        assert_eq!(v.check("t", &json!({ "id": "abcdefgh", "text": "ünïcödé ✓", "note": "a\nb\tc" })), Ok(()));
        assert_eq!(refusals(&v, json!({ "id": "ééééé" })), ["/arguments/id: at most 8 bytes of UTF-8"]);
        for bad in
            ["a\u{0}b", "a\u{1b}[31m", "a\u{7f}", "a\u{85}", "abc\u{202e}gpj.exe", "a\u{2066}b", "a\u{e0041}b", "a\nb"]
        {
            let r = refusals(&v, json!({ "text": bad }));
            assert_eq!(r.len(), 1, "{bad:?}: {r:?}");
            assert!(r[0].starts_with("/arguments/text: text without control"), "{r:?}");
        }
        // Opting in admits tab, LF and CR only.
        assert_eq!(refusals(&v, json!({ "note": "a\u{202e}b" })).len(), 1);
    }

    #[test]
    fn one_of_mixes_are_refused_as_such() {
        let v = tool(json!({
            "type": "object",
            "oneOf": [
                { "properties": { "ticket_id": { "type": "string", "maxLength": 12 } }, "required": ["ticket_id"],
                  "additionalProperties": false },
                { "properties": { "project": { "type": "string", "enum": ["billing"] },
                                  "number": { "type": "integer", "minimum": 1, "maximum": 9 } },
                  "required": ["project", "number"], "additionalProperties": false },
            ],
            "unevaluatedProperties": false,
        }));
        assert_eq!(v.check("t", &json!({ "ticket_id": "TKT-1" })), Ok(()));
        assert_eq!(v.check("t", &json!({ "project": "billing", "number": 3 })), Ok(()));
        let r = refusals(&v, json!({ "ticket_id": "TKT-1", "project": "billing", "number": 3 }));
        assert!(r.iter().any(|f| f.contains("exactly one of the alternatives")), "{r:?}");
    }
}
