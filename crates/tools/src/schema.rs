//! Schemas derived from Rust types: a tool's input schema from its `Args`, an output schema from its output type,
//! through [`schemars`] (re-exported by this crate and by `mcpfleet`, so a tool's schemars is always ours).
//!
//! What the derive gives, and what the lint then asks for:
//! - `#[serde(deny_unknown_fields)]` closes an object (`additionalProperties: false`); without it the startup lint
//!   refuses the tool (`open-object`).
//! - Bounds come from attributes: `#[schemars(length(max = 64))]` (`maxLength`, `maxItems`),
//!   `#[schemars(range(min = 1, max = 100))]` (`minimum`, `maximum`), `#[schemars(regex(pattern = "^[a-z]+$"))]`.
//!   Unsigned integers get `minimum: 0` and a `format` such as `uint32`, but no maximum: the lint wants one.
//! - A unit-variant `enum` becomes `enum` of its names; `Option<T>` a property that may be absent or null.
//! - Doc comments become `description`s.
//!
//! Nested types are inlined (no `$defs`/`$ref`), so every level is checked where it is declared; a recursive type
//! keeps a `$ref`, which the lint refuses unless it is closed with `unevaluatedProperties: false` by hand.

use serde_json::Value;

/// The JSON Schema 2020-12 document of `T`, as a tool publishes it: nested types inlined, and no root `title`
/// (schemars names it after the Rust type, which tells the model nothing).
///
/// ```
/// use mcpfleet_tools::schemars::{self, JsonSchema};
/// use serde::Deserialize;
///
/// #[derive(Deserialize, JsonSchema)]
/// #[serde(deny_unknown_fields)]
/// struct Args {
///     /// Who to greet.
///     #[schemars(length(max = 64))]
///     name: String,
/// }
///
/// let schema = mcpfleet_tools::schema::derive::<Args>();
/// assert_eq!(schema["additionalProperties"], false);
/// assert_eq!(schema["properties"]["name"]["maxLength"], 64);
/// assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
/// ```
#[must_use]
pub fn derive<T: schemars::JsonSchema>() -> Value {
    let generator =
        schemars::generate::SchemaSettings::draft2020_12().with(|s| s.inline_subschemas = true).into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    if let Some(o) = schema.as_object_mut() {
        o.remove("title");
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lint::{Severity, lint_schema};
    use crate::validate::Validator;
    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "only the schema is looked at")]
    struct Bounded {
        #[schemars(range(min = 0, max = 200))]
        u8: u8,
        #[schemars(range(min = -5, max = 5))]
        i16: i16,
        #[schemars(range(min = 0, max = 4_000_000_000_u32))]
        u32: u32,
        #[schemars(range(min = 0, max = 9_000_000_000_000_u64))]
        u64: u64,
        #[schemars(range(min = -1_000_000, max = 1_000_000))]
        i64: i64,
        #[schemars(range(min = 0.0, max = 1.0))]
        f64: f64,
        #[schemars(length(max = 8))]
        s: String,
        #[schemars(length(max = 3), inner(length(max = 4)))]
        list: Vec<String>,
        mode: Mode,
        inner: Option<Inner>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        Fast,
        Careful,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "only the schema is looked at")]
    struct Inner {
        #[schemars(length(max = 2), regex(pattern = "^[a-z]+$"))]
        tag: String,
    }

    fn tool(schema: Value) -> Vec<Value> {
        vec![json!({ "name": "t", "inputSchema": schema })]
    }

    fn ok() -> Value {
        json!({ "u8": 200, "i16": -5, "u32": 4_000_000_000_u32, "u64": 9_000_000_000_000_u64, "i64": -3, "f64": 0.5,
                "s": "abc", "list": ["a"], "mode": "careful", "inner": { "tag": "ab" } })
    }

    #[test]
    fn a_bounded_closed_struct_derives_a_schema_the_lint_accepts() {
        let schema = derive::<Bounded>();
        let findings = lint_schema(&schema);
        assert!(findings.iter().all(|f| f.severity == Severity::Warning), "{findings:?}\n{schema:#}");
        assert!(schema.get("title").is_none() && schema.get("$defs").is_none(), "{schema:#}");
        assert_eq!(schema["properties"]["mode"]["enum"], json!(["fast", "careful"]));
        assert_eq!(schema["properties"]["inner"]["additionalProperties"], false, "{schema:#}");
    }

    /// The `format`s schemars puts on numbers (`uint8`, `int16`, `uint32`, `uint64`, `int64`, `double`) are not
    /// JSON Schema formats: the validator must compile them (they assert nothing on numbers), and the bounds that
    /// hold are the `minimum`/`maximum` the attributes give.
    #[test]
    fn the_formats_schemars_emits_compile_and_the_bounds_hold() {
        let schema = derive::<Bounded>();
        let formats: Vec<&str> =
            schema["properties"].as_object().into_iter().flatten().filter_map(|(_, p)| p["format"].as_str()).collect();
        for f in ["uint8", "int16", "uint32", "uint64", "int64", "double"] {
            assert!(formats.contains(&f), "schemars emits {f}: {formats:?}");
        }
        let v = Validator::new(&tool(schema)).unwrap_or_else(|e| panic!("{e}"));
        assert!(v.check("t", &ok()).is_ok(), "{:?}", v.check("t", &ok()));
        let refuse = |field: &str, value: Value| {
            let mut args = ok();
            args[field] = value;
            let e = v.check("t", &args).expect_err(field);
            assert!(e.iter().any(|i| i.pointer.starts_with(&format!("/arguments/{field}"))), "{field}: {e:?}");
        };
        refuse("u8", json!(201));
        refuse("u8", json!(-1));
        refuse("i16", json!(6));
        refuse("u32", json!(4_000_000_001_u64));
        refuse("u64", json!(-1));
        refuse("i64", json!(1.5));
        refuse("f64", json!(1.5));
        refuse("s", json!("123456789"));
        refuse("list", json!(["a", "b", "c", "d"]));
        refuse("mode", json!("reckless"));
        refuse("inner", json!({ "tag": "ab", "extra": 1 }));
        refuse("inner", json!({ "tag": "AB" }));
    }

    /// schemars gives an `IpAddr` the format `ip`, which JSON Schema does not define: the validator knows it, so
    /// an address that the struct would refuse is refused by the published schema first. A format the validator
    /// does not know refuses the schema (start-up exits 64 naming the tool), never passes unenforced.
    #[test]
    fn the_string_formats_schemars_emits_are_enforced_and_an_unknown_one_refused() {
        #[derive(Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        #[expect(dead_code, reason = "only the schema is looked at")]
        struct Host {
            #[schemars(length(max = 45))]
            ip: std::net::IpAddr,
        }
        let schema = derive::<Host>();
        assert_eq!(schema["properties"]["ip"]["format"], "ip", "{schema}");
        let v = Validator::new(&tool(schema)).unwrap_or_else(|e| panic!("{e}"));
        assert!(v.check("t", &json!({ "ip": "10.0.0.1" })).is_ok());
        assert!(v.check("t", &json!({ "ip": "::1" })).is_ok());
        assert!(v.check("t", &json!({ "ip": "10.0.0.300" })).is_err());
        let typo = json!({ "type": "object", "additionalProperties": false,
                           "properties": { "to": { "type": "string", "maxLength": 99, "format": "emial" } } });
        let e = Validator::new(&tool(typo)).expect_err("an unknown format");
        assert!(e.starts_with("t: the input schema does not compile") && e.contains("emial"), "{e}");
    }

    #[test]
    fn an_open_or_unbounded_struct_fails_the_lint() {
        #[derive(Deserialize, JsonSchema)]
        #[expect(dead_code, reason = "only the schema is looked at")]
        struct Open {
            name: String,
            count: u32,
            tags: Vec<String>,
        }
        let rules: Vec<(String, &str)> =
            lint_schema(&derive::<Open>()).into_iter().map(|f| (f.pointer, f.rule)).collect();
        for expected in [
            ("", "open-object"),
            ("/properties/name", "unbounded-string"),
            ("/properties/count", "unbounded-number"),
            ("/properties/tags", "unbounded-array"),
        ] {
            assert!(rules.iter().any(|(p, r)| (p.as_str(), *r) == expected), "{expected:?} in {rules:?}");
        }
    }
}
