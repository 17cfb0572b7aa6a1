//! The schema lint: a tool's input schema must describe one safe request, closed at every level and bounded
//! everywhere. The server refuses to start when a tool's schema breaks a rule (exit 64, every offence with its JSON
//! pointer), and `mcpfleet lint` runs the same function against any server's `tools/list`.
//!
//! Errors:
//! - `open-object`: an object that is not closed: `additionalProperties: false`, or `unevaluatedProperties: false`
//!   where it is composed with `allOf`/`oneOf`/`anyOf`/`$ref` (there `additionalProperties: false` would reject the
//!   properties the composition declares, so it is an offence too: `composition-needs-unevaluated`). A branch
//!   (`allOf`/`oneOf`/`anyOf`/`if`/`then`/`else`) that only constrains properties its closed parent declares (e.g.
//!   `{"required": ["phone"]}`) is closed by that parent, and needs neither.
//! - `object-without-properties`: a property of type `object` that declares no `properties`.
//! - `unbounded-string`: a string without `maxLength` (an `enum` or `const` bounds it).
//! - `unbounded-number`: a number or integer without a minimum and a maximum.
//! - `unbounded-array`: an array without `maxItems`.
//! - `ambiguous-oneof`: a `oneOf` two of whose branches can match the same object.
//! - `dialect`: a `$schema` other than JSON Schema 2020-12.
//! - `x-mcp-header`: an `x-mcp-header` annotation that breaks the 2026-07-28 rules (see [`crate::headers`]);
//!   clients drop such a tool from their list.
//!
//! Warnings:
//! - `id-without-pattern`: an id-like string (`id`, `*_id`, `*Id`) without a `pattern`.

use serde_json::{Map, Value};
use std::fmt;

/// JSON Schema 2020-12, the only dialect a tool may declare.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

/// One finding: where (a JSON pointer into the schema), which rule, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub pointer: String,
    pub rule: &'static str,
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pointer = if self.pointer.is_empty() { "/" } else { &self.pointer };
        write!(f, "{pointer}: {} ({})", self.message, self.rule)
    }
}

const COMPOSITIONS: [&str; 3] = ["allOf", "oneOf", "anyOf"];

/// Lints one input schema. Findings are in document order.
#[must_use]
pub fn lint_schema(schema: &Value) -> Vec<Finding> {
    let mut l = Linter { findings: Vec::new() };
    if let Some(d) = schema.get("$schema")
        && d.as_str().map(|s| s.trim_end_matches('#')) != Some(DIALECT)
    {
        l.error("/$schema", "dialect", format!("declares {d}; only JSON Schema 2020-12 ({DIALECT}) is accepted"));
    }
    l.walk(schema, "", Context::Root);
    if let Err(offences) = crate::headers::param_headers(schema) {
        for (at, message) in offences {
            l.error(&at, "x-mcp-header", message);
        }
    }
    l.findings
}

/// Lints a `tools/list` entry (its `inputSchema`); the pointers are relative to the input schema.
#[must_use]
pub fn lint_tool(tool: &Value) -> Vec<Finding> {
    match tool.get("inputSchema") {
        Some(s) if s.is_object() => lint_schema(s),
        _ => vec![Finding {
            severity: Severity::Error,
            pointer: String::new(),
            rule: "open-object",
            message: "the tool has no inputSchema object".to_owned(),
        }],
    }
}

/// Where a subschema sits, which decides what it must declare itself.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Root,
    /// The value of a property.
    Property,
    /// A branch of a composition whose parent closes it with `unevaluatedProperties: false`.
    ClosedBranch,
    /// Anything else (array items, `$defs`, an unclosed composition's branch).
    Other,
}

struct Linter {
    findings: Vec<Finding>,
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn types(s: &Map<String, Value>) -> Vec<&str> {
    match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn is_false(v: Option<&Value>) -> bool {
    v == Some(&Value::Bool(false))
}

impl Linter {
    fn error(&mut self, pointer: &str, rule: &'static str, message: String) {
        self.findings.push(Finding { severity: Severity::Error, pointer: pointer.to_owned(), rule, message });
    }

    fn warn(&mut self, pointer: &str, rule: &'static str, message: String) {
        self.findings.push(Finding { severity: Severity::Warning, pointer: pointer.to_owned(), rule, message });
    }

    fn walk(&mut self, schema: &Value, at: &str, cx: Context) {
        let Value::Object(s) = schema else { return };
        let ty = types(s);
        let composed = COMPOSITIONS.iter().any(|k| s.contains_key(*k)) || s.contains_key("$ref");
        let bounded_by_value = s.contains_key("enum") || s.contains_key("const");
        let is_object = ty.contains(&"object") || s.contains_key("properties");
        if is_object {
            self.object(s, at, cx, composed);
        }
        if ty.contains(&"string") && !bounded_by_value && !s.contains_key("maxLength") {
            self.error(at, "unbounded-string", "a string without maxLength".to_owned());
        }
        if (ty.contains(&"number") || ty.contains(&"integer")) && !bounded_by_value {
            let low = s.contains_key("minimum") || s.contains_key("exclusiveMinimum");
            let high = s.contains_key("maximum") || s.contains_key("exclusiveMaximum");
            if !(low && high) {
                self.error(at, "unbounded-number", "a number without both a minimum and a maximum".to_owned());
            }
        }
        if ty.contains(&"array") && !s.contains_key("maxItems") {
            self.error(at, "unbounded-array", "an array without maxItems".to_owned());
        }
        if let Some(Value::Object(props)) = s.get("properties") {
            for (k, v) in props {
                let p = format!("{at}/properties/{}", escape(k));
                self.id_like(k, v, &p);
                self.walk(v, &p, Context::Property);
            }
        }
        // Branches that only constrain the closed parent's own properties are closed by it.
        let parent_closes = |v: &Value| {
            is_false(s.get("additionalProperties")) && declared(v).iter().all(|k| has_property(s, k)) && !refers(v)
        };
        for key in ["items", "additionalProperties", "unevaluatedProperties", "not", "if", "then", "else", "contains"] {
            if let Some(v @ Value::Object(_)) = s.get(key) {
                let cx = if matches!(key, "if" | "then" | "else") && parent_closes(v) {
                    Context::ClosedBranch
                } else {
                    Context::Other
                };
                self.walk(v, &format!("{at}/{key}"), cx);
            }
        }
        for key in ["$defs", "definitions", "patternProperties", "dependentSchemas"] {
            if let Some(Value::Object(m)) = s.get(key) {
                for (k, v) in m {
                    self.walk(v, &format!("{at}/{key}/{}", escape(k)), Context::Other);
                }
            }
        }
        let closes_branches = is_false(s.get("unevaluatedProperties"));
        for key in ["prefixItems", "allOf", "oneOf", "anyOf"] {
            if let Some(Value::Array(a)) = s.get(key) {
                for (i, v) in a.iter().enumerate() {
                    let closed = key != "prefixItems" && (closes_branches || parent_closes(v));
                    let branch_cx = if closed { Context::ClosedBranch } else { Context::Other };
                    self.walk(v, &format!("{at}/{key}/{i}"), branch_cx);
                }
            }
        }
        if let Some(Value::Array(branches)) = s.get("oneOf") {
            self.one_of(branches, at);
        }
    }

    fn object(&mut self, s: &Map<String, Value>, at: &str, cx: Context, composed: bool) {
        let additional = is_false(s.get("additionalProperties"));
        let unevaluated = is_false(s.get("unevaluatedProperties"));
        // additionalProperties:false is wrong on a composed object only when the composition declares properties
        // the object itself does not (or reaches through a $ref, which may).
        let escapes = s.contains_key("$ref")
            || COMPOSITIONS
                .iter()
                .filter_map(|k| s.get(*k).and_then(Value::as_array))
                .flatten()
                .any(|b| refers(b) || declared(b).iter().any(|k| !has_property(s, k)));
        if composed && additional && !unevaluated && escapes {
            self.error(
                at,
                "composition-needs-unevaluated",
                "additionalProperties:false on a composed object rejects the properties its allOf/oneOf/anyOf/$ref \
                 declare; use unevaluatedProperties:false"
                    .to_owned(),
            );
        } else if !(additional || unevaluated || cx == Context::ClosedBranch) {
            // (A composed object closed by additionalProperties:false whose composition adds no property is closed.)
            let how = if composed { "unevaluatedProperties:false" } else { "additionalProperties:false" };
            self.error(at, "open-object", format!("an object that is not closed: add {how}"));
        }
        if cx == Context::Property && !s.contains_key("properties") && !composed {
            self.error(
                at,
                "object-without-properties",
                "a property of type object that declares no properties".to_owned(),
            );
        }
    }

    fn id_like(&mut self, name: &str, v: &Value, at: &str) {
        let id_like = name == "id" || name.ends_with("_id") || name.ends_with("Id");
        let Value::Object(s) = v else { return };
        let stringy = types(s).contains(&"string");
        if id_like && stringy && !s.contains_key("pattern") && !s.contains_key("enum") && !s.contains_key("const") {
            self.warn(at, "id-without-pattern", format!("the id-like string {name:?} has no pattern"));
        }
    }

    /// Two branches are exclusive when no object can satisfy both: their types differ, a property both require has
    /// disjoint `const`/`enum` values, or one is closed and forbids a property the other requires.
    fn one_of(&mut self, branches: &[Value], at: &str) {
        for i in 0..branches.len() {
            for j in i + 1..branches.len() {
                if !exclusive(&branches[i], &branches[j]) {
                    self.error(
                        &format!("{at}/oneOf"),
                        "ambiguous-oneof",
                        format!(
                            "branches {i} and {j} can both match the same object: close each branch \
                             (additionalProperties:false) or give them a discriminating const"
                        ),
                    );
                }
            }
        }
    }
}

/// Every property name a subschema declares or requires, through its compositions and conditionals.
fn declared(v: &Value) -> Vec<&str> {
    let Value::Object(s) = v else { return Vec::new() };
    let mut out: Vec<&str> = s
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    out.extend(required(s));
    for key in COMPOSITIONS {
        for b in s.get(key).and_then(Value::as_array).into_iter().flatten() {
            out.extend(declared(b));
        }
    }
    for key in ["if", "then", "else", "not"] {
        if let Some(b) = s.get(key) {
            out.extend(declared(b));
        }
    }
    out
}

/// Whether a subschema (or one of its branches) uses `$ref`, which may declare anything.
fn refers(v: &Value) -> bool {
    let Value::Object(s) = v else { return false };
    s.contains_key("$ref")
        || COMPOSITIONS.iter().filter_map(|k| s.get(*k).and_then(Value::as_array)).flatten().any(refers)
        || ["if", "then", "else", "not"].iter().filter_map(|k| s.get(*k)).any(refers)
}

fn has_property(s: &Map<String, Value>, name: &str) -> bool {
    s.get("properties").and_then(Value::as_object).is_some_and(|p| p.contains_key(name))
}

fn required(s: &Map<String, Value>) -> Vec<&str> {
    s.get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn allowed_values(s: &Value) -> Option<Vec<&Value>> {
    if let Some(c) = s.get("const") {
        return Some(vec![c]);
    }
    s.get("enum").and_then(Value::as_array).map(|a| a.iter().collect())
}

fn exclusive(a: &Value, b: &Value) -> bool {
    let (Value::Object(x), Value::Object(y)) = (a, b) else { return false };
    let (tx, ty) = (types(x), types(y));
    if !tx.is_empty() && !ty.is_empty() && !tx.iter().any(|t| ty.contains(t)) {
        return true;
    }
    // A discriminator: a property both require, with disjoint values.
    for k in required(x) {
        if !required(y).contains(&k) {
            continue;
        }
        let vx = x.get("properties").and_then(|p| p.get(k)).and_then(allowed_values);
        let vy = y.get("properties").and_then(|p| p.get(k)).and_then(allowed_values);
        if let (Some(vx), Some(vy)) = (vx, vy)
            && !vx.iter().any(|v| vy.contains(v))
        {
            return true;
        }
    }
    // A closed branch that forbids what the other requires.
    let forbids = |closed: &Map<String, Value>, other: &Map<String, Value>| {
        is_false(closed.get("additionalProperties"))
            && required(other).iter().any(|k| closed.get("properties").and_then(|p| p.get(*k)).is_none())
    };
    forbids(x, y) || forbids(y, x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(schema: Value) -> Vec<(String, &'static str)> {
        let mut r: Vec<_> = lint_schema(&schema).into_iter().map(|f| (f.pointer, f.rule)).collect();
        r.sort();
        r
    }

    #[test]
    fn branches_that_only_constrain_the_closed_parent_are_closed() {
        let props = json!({ "kind": { "type": "string", "enum": ["phone", "email"] },
            "phone": { "type": "string", "maxLength": 20 }, "email": { "type": "string", "maxLength": 99 } });
        // The conformance suite's 2020-12 shape: allOf/anyOf of `required`, and if/then/else on the parent's
        // properties, under additionalProperties:false.
        let ok = json!({ "type": "object", "properties": props, "additionalProperties": false,
            "allOf": [{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }],
            "if": { "properties": { "kind": { "const": "phone" } }, "required": ["kind"] },
            "then": { "required": ["phone"] }, "else": { "required": ["email"] } });
        assert_eq!(rules(ok), vec![]);
        // A branch that brings a property of its own still needs unevaluatedProperties, and a conditional that
        // names a property the parent lacks is not closed by it.
        let adds = json!({ "type": "object", "properties": props, "additionalProperties": false,
            "allOf": [{ "properties": { "fax": { "type": "string", "maxLength": 20 } } }] });
        assert!(rules(adds).iter().any(|(_, r)| *r == "composition-needs-unevaluated"));
        let foreign = json!({ "type": "object", "properties": props, "additionalProperties": false,
            "if": { "properties": { "fax": { "const": "x" } } } });
        assert_eq!(rules(foreign), vec![("/if".to_owned(), "open-object")]);
    }

    #[test]
    fn a_closed_bounded_schema_passes() {
        let s = json!({
            "$schema": DIALECT,
            "type": "object",
            "properties": {
                "query": { "type": "string", "minLength": 1, "maxLength": 500 },
                "limit": { "type": "integer", "minimum": 1, "maximum": 20 },
                "format": { "type": "string", "enum": ["csv", "json"] },
                "tags": { "type": "array", "maxItems": 5, "items": { "type": "string", "maxLength": 20 } },
                "customer_id": { "type": "string", "maxLength": 36, "pattern": "^[A-Za-z0-9_-]+$" },
                "range": { "type": "object", "properties": { "from": { "type": "integer", "minimum": 0, "maximum": 9 } },
                           "additionalProperties": false },
            },
            "required": ["query"],
            "additionalProperties": false,
        });
        assert_eq!(rules(s), vec![]);
    }

    #[test]
    fn every_rule_fires_with_its_pointer() {
        let s = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {
                "options": { "type": "object" },
                "note": { "type": "string" },
                "n": { "type": "number", "minimum": 0 },
                "list": { "type": "array", "items": { "type": "string", "maxLength": 3 } },
                "user_id": { "type": "string", "maxLength": 36 },
                "a/b": { "type": "object", "properties": {}, "allOf": [{ "properties": { "x": { "const": 1 } } }],
                         "additionalProperties": false },
            },
        });
        let mut expected = vec![
            ("/$schema".to_owned(), "dialect"),
            (String::new(), "open-object"),
            ("/properties/options".to_owned(), "open-object"),
            ("/properties/options".to_owned(), "object-without-properties"),
            ("/properties/note".to_owned(), "unbounded-string"),
            ("/properties/n".to_owned(), "unbounded-number"),
            ("/properties/list".to_owned(), "unbounded-array"),
            ("/properties/user_id".to_owned(), "id-without-pattern"),
            ("/properties/a~1b".to_owned(), "composition-needs-unevaluated"),
            // The allOf branch is not closed by an unevaluatedProperties:false parent.
            ("/properties/a~1b/allOf/0".to_owned(), "open-object"),
        ];
        expected.sort();
        assert_eq!(rules(s), expected);
    }

    #[test]
    fn one_of_branches_must_exclude_each_other() {
        let branch = |props: Value, req: &[&str], closed: bool| {
            let mut b = json!({ "type": "object", "properties": props, "required": req });
            if closed {
                b["additionalProperties"] = json!(false);
            }
            b
        };
        let id = json!({ "ticket_id": { "type": "string", "maxLength": 12, "pattern": "^TKT-[0-9]{1,8}$" } });
        let pair = json!({ "project": { "type": "string", "enum": ["billing"] },
                           "number": { "type": "integer", "minimum": 1, "maximum": 99 } });
        let schema = |a: Value, b: Value| json!({ "type": "object", "oneOf": [a, b], "unevaluatedProperties": false });
        // Open branches: {ticket_id, project, number} matches both.
        let open =
            schema(branch(id.clone(), &["ticket_id"], false), branch(pair.clone(), &["project", "number"], false));
        assert_eq!(rules(open), vec![("/oneOf".to_owned(), "ambiguous-oneof")]);
        // Closed branches exclude each other.
        let closed = schema(branch(id, &["ticket_id"], true), branch(pair, &["project", "number"], true));
        assert_eq!(rules(closed), vec![]);
        // So does a discriminator.
        let kind = |k: &str| json!({ "kind": { "const": k }, "n": { "type": "integer", "minimum": 0, "maximum": 1 } });
        let disc = schema(branch(kind("a"), &["kind"], false), branch(kind("b"), &["kind"], false));
        assert_eq!(rules(disc), vec![]);
    }
}
