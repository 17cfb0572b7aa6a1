//! JSON as requests carry it: objects, and a parse that finds the duplicate keys a `Value` cannot show.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::fmt;

/// A JSON object: `params`, a tool's arguments, a result.
pub type JsonObject = Map<String, Value>;

/// Parses a JSON document into a [`Value`] (the last of duplicate keys wins, as with `serde_json`) and, in the same
/// pass, finds the JSON pointer of the first duplicate object key, if any: a `Value` cannot show one afterwards.
///
/// # Errors
/// The document is not JSON (or nests deeper than `serde_json` allows).
pub fn parse_strict(raw: &[u8]) -> Result<(Value, Option<String>), serde_json::Error> {
    let found = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(raw);
    let value = Strict(&found).deserialize(&mut de)?;
    de.end()?;
    let pointer = found.into_inner().map(|segments: Vec<String>| {
        segments.iter().rev().map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1"))).collect()
    });
    Ok((value, pointer))
}

/// Builds a [`Value`]; the first duplicate key found is recorded as its path segments, innermost first (each level
/// above adds its own on the way out, so the path is built only for the duplicate).
struct Strict<'a>(&'a RefCell<Option<Vec<String>>>);

impl Strict<'_> {
    /// After a child value was parsed: if it found the duplicate, this level adds the segment it descended by.
    fn climb(&self, found_before: bool, segment: impl FnOnce() -> String) {
        if !found_before && let Some(path) = self.0.borrow_mut().as_mut() {
            path.push(segment());
        }
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let found_before = self.0.borrow().is_some();
            let Some(v) = seq.next_element_seed(Strict(self.0))? else { break };
            self.climb(found_before, || items.len().to_string());
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let found_before = self.0.borrow().is_some();
            let v = map.next_value_seed(Strict(self.0))?;
            self.climb(found_before, || k.clone());
            if self.0.borrow().is_none() && out.contains_key(&k) {
                *self.0.borrow_mut() = Some(vec![k.clone()]);
            }
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn duplicate_key(raw: &[u8]) -> Option<String> {
        let (value, dup) = parse_strict(raw).unwrap();
        // The value is the one serde_json builds: the last of duplicate keys wins.
        assert_eq!(value, serde_json::from_slice::<Value>(raw).unwrap());
        dup
    }

    #[test]
    fn duplicate_keys_are_found_at_any_depth() {
        assert_eq!(duplicate_key(br#"{"a":1,"b":{"c":2,"c":3}}"#).as_deref(), Some("/b/c"));
        assert_eq!(duplicate_key(br#"{"a":1,"a":2}"#).as_deref(), Some("/a"));
        assert_eq!(duplicate_key(br#"{"a":[{"x":1},{"x":1,"y/z":2,"y/z":3}]}"#).as_deref(), Some("/a/1/y~1z"));
        assert_eq!(duplicate_key(br#"{"a":{"b":1},"c":{"b":1}}"#), None);
        assert_eq!(duplicate_key(br#"{"a":"\u0041","A":1}"#), None);
        assert_eq!(duplicate_key(br#"{"\u0041":1,"A":2}"#).as_deref(), Some("/A"), "escapes are keys too");
        assert_eq!(duplicate_key(br#"{"a":{"b":{"c":1,"c":2}},"a":3}"#).as_deref(), Some("/a/b/c"), "the first one");
        assert_eq!(duplicate_key(br#"[1,2.5,-3,null,true,"s",[],{}]"#), None);
        assert!(parse_strict(b"{} x").is_err() && parse_strict(b"{\"a\":").is_err());
    }
}
