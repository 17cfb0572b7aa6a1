//! `x-mcp-header` (2026-07-28, SEP-2243): a tool may mark a parameter to be mirrored into an `Mcp-Param-{name}`
//! HTTP header, so that gateways can route on it without parsing the body. This module finds the annotations of an
//! input schema and checks the spec's constraints on them; the lint refuses a tool whose annotations break them
//! (clients would drop it), and the transport checks every call's headers against its arguments.

use serde_json::Value;

/// A parameter mirrored into a header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamHeader {
    /// The name part of `Mcp-Param-{name}`, as declared.
    pub name: String,
    /// The chain of `properties` keys from the schema root to the parameter.
    pub path: Vec<String>,
    pub kind: ParamKind,
}

/// What a mirrored parameter holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    String,
    Integer,
    Boolean,
}

/// One annotation that breaks the rules: its JSON pointer and what is wrong.
pub type Offence = (String, String);

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The `x-mcp-header` annotations of `schema`, or every annotation that breaks a rule: a name that is empty, not
/// an HTTP token, or repeated (case-insensitively); a parameter that is not a string, integer or boolean; or an
/// annotation not reachable from the root through `properties` alone.
///
/// # Errors
/// The offences, each with its JSON pointer.
pub fn param_headers(schema: &Value) -> Result<Vec<ParamHeader>, Vec<Offence>> {
    let mut found = Vec::new();
    let mut offences = Vec::new();
    walk(schema, "", Some(Vec::new()), &mut found, &mut offences);
    let mut seen: Vec<String> = Vec::new();
    for h in &found {
        let lower = h.name.to_ascii_lowercase();
        if seen.contains(&lower) {
            offences.push((
                pointer(&h.path),
                format!("x-mcp-header {:?} is used twice (names are case-insensitive)", h.name),
            ));
        }
        seen.push(lower);
    }
    if offences.is_empty() { Ok(found) } else { Err(offences) }
}

fn pointer(path: &[String]) -> String {
    path.iter().map(|k| format!("/properties/{}", k.replace('~', "~0").replace('/', "~1"))).collect()
}

/// Walks every subschema; `path` is the `properties` chain while the walk has only followed `properties`.
fn walk(v: &Value, at: &str, path: Option<Vec<String>>, found: &mut Vec<ParamHeader>, offences: &mut Vec<Offence>) {
    let Value::Object(s) = v else { return };
    if let Some(h) = s.get("x-mcp-header") {
        match (&path, h.as_str()) {
            (None, _) => offences.push((
                at.to_owned(),
                "x-mcp-header must sit on a property reached from the root through properties alone".to_owned(),
            )),
            (Some(p), _) if p.is_empty() => {
                offences
                    .push((at.to_owned(), "x-mcp-header must sit on a parameter, not on the schema root".to_owned()));
            }
            (Some(_), Some(n)) if n.is_empty() || !n.bytes().all(is_tchar) => {
                offences.push((at.to_owned(), format!("x-mcp-header {n:?} must be a non-empty HTTP token")));
            }
            (Some(p), Some(n)) => {
                let kind = match s.get("type").and_then(Value::as_str) {
                    Some("string") => Some(ParamKind::String),
                    Some("integer") => Some(ParamKind::Integer),
                    Some("boolean") => Some(ParamKind::Boolean),
                    _ => None,
                };
                const SAFE: f64 = 9_007_199_254_740_991.0;
                let within = |k: &str, ok: fn(f64) -> bool| s.get(k).and_then(Value::as_f64).is_some_and(ok);
                let safe = within("minimum", |v| v >= -SAFE) && within("maximum", |v| v <= SAFE);
                match kind {
                    Some(ParamKind::Integer) if !safe => offences.push((
                        at.to_owned(),
                        "an x-mcp-header integer needs a minimum and a maximum within ±(2^53 − 1)".to_owned(),
                    )),
                    Some(kind) => found.push(ParamHeader { name: n.to_owned(), path: p.clone(), kind }),
                    None => offences.push((
                        at.to_owned(),
                        "x-mcp-header needs a parameter of type string, integer or boolean".to_owned(),
                    )),
                }
            }
            (Some(_), None) => offences.push((at.to_owned(), "x-mcp-header must be a string".to_owned())),
        }
    }
    for (key, child) in s {
        // Instance data, not schemas.
        if matches!(key.as_str(), "default" | "examples" | "const" | "enum") {
            continue;
        }
        match (key.as_str(), child) {
            ("properties", Value::Object(props)) => {
                for (k, p) in props {
                    let next = path.as_ref().map(|base| {
                        let mut n = base.clone();
                        n.push(k.clone());
                        n
                    });
                    walk(
                        p,
                        &format!("{at}/properties/{}", k.replace('~', "~0").replace('/', "~1")),
                        next,
                        found,
                        offences,
                    );
                }
            }
            (_, Value::Object(_)) => walk(child, &format!("{at}/{key}"), None, found, offences),
            (_, Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{at}/{key}/{i}"), None, found, offences);
                }
            }
            _ => {}
        }
    }
}

/// The value of `header` at its path in `args`, as its header text, if present and not null.
#[must_use]
pub fn header_text(header: &ParamHeader, args: &serde_json::Map<String, Value>) -> Option<Result<String, ()>> {
    let (first, rest) = header.path.split_first()?;
    let mut v = args.get(first)?;
    for k in rest {
        v = v.get(k)?;
    }
    Some(match (header.kind, v) {
        (_, Value::Null) => return None,
        (ParamKind::String, Value::String(s)) => Ok(s.clone()),
        (ParamKind::Integer, Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        (ParamKind::Boolean, Value::Bool(b)) => Ok(b.to_string()),
        // The wrong type: the schema validation refuses it.
        _ => Err(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn annotations_are_found_on_properties_chains_only() {
        let s = json!({ "type": "object", "properties": {
            "region": { "type": "string", "x-mcp-header": "Region" },
            "where": { "type": "object", "properties": { "zone": { "type": "integer", "minimum": 0, "maximum": 99,
                "x-mcp-header": "Zone" } } } } });
        let h = param_headers(&s).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(
            (h[1].name.as_str(), h[1].path.clone(), h[1].kind),
            ("Zone", vec!["where".to_owned(), "zone".to_owned()], ParamKind::Integer)
        );
        let args = |v: Value| v.as_object().cloned().unwrap();
        assert_eq!(header_text(&h[1], &args(json!({ "where": { "zone": 7 } }))), Some(Ok("7".to_owned())));
        assert_eq!(header_text(&h[0], &args(json!({ "region": null }))), None);
        let bad = json!({ "type": "object", "properties": {
            "a": { "type": "number", "x-mcp-header": "A" },
            "b": { "type": "string", "x-mcp-header": "a" },
            "c": { "type": "string", "x-mcp-header": "bad name" },
            "d": { "type": "array", "items": { "type": "string", "x-mcp-header": "D" } } } });
        let offences = param_headers(&bad).unwrap_err();
        let at: Vec<&str> = offences.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(at, ["/properties/a", "/properties/c", "/properties/d/items"]);
        let dup = json!({ "type": "object", "properties": {
            "a": { "type": "string", "x-mcp-header": "Same" }, "b": { "type": "string", "x-mcp-header": "same" } } });
        assert!(param_headers(&dup).unwrap_err()[0].1.contains("twice"));
    }
}
