//! Which claims of a token a policy's rules read: a verifier keeps only those in the principal it caches
//! (`principal.claims`), so that a token's other claims (personal data, large groups) are not held per caller.
//! Found by walking each compiled expression: `principal.claims.NAME`, `principal.claims["NAME"]` and
//! `has(principal.claims.NAME)` name one claim; any other use of `principal.claims` (an index computed at run time,
//! the map passed whole) or of `principal` as a whole keeps every claim.

use crate::Expr;
use cel::IdedExpr;
use cel::common::ast::{EntryExpr, Expr as Node, LiteralValue, operators};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// The claims a policy reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimsRead {
    /// Every claim (a rule reads the claims in a way that cannot be named in advance).
    pub all: bool,
    /// The claims read by name.
    pub names: BTreeSet<String>,
}

impl ClaimsRead {
    /// The claims the expressions read.
    pub(crate) fn of<'a>(exprs: impl IntoIterator<Item = &'a Expr>) -> Self {
        let mut read = Self::default();
        for e in exprs {
            read.walk(e.program.expression());
        }
        read
    }

    /// What to keep of `claims`.
    #[must_use]
    pub fn keep(&self, claims: &Map<String, Value>) -> Map<String, Value> {
        if self.all {
            return claims.clone();
        }
        self.names.iter().filter_map(|n| claims.get(n).map(|v| (n.clone(), v.clone()))).collect()
    }

    fn walk(&mut self, e: &IdedExpr) {
        match &e.expr {
            Node::Select(s) if is_claims(&s.operand) => {
                self.names.insert(s.field.clone());
            }
            Node::Select(s) if is_principal(&s.operand) => {
                // `principal.issuer`, `principal.subject`; `principal.claims` reached here is the map itself.
                if s.field == "claims" {
                    self.all = true;
                }
            }
            Node::Call(c)
                if (c.func_name == operators::INDEX || c.func_name == operators::OPT_INDEX)
                    && c.args.first().is_some_and(is_claims) =>
            {
                match c.args.get(1).map(|k| &k.expr) {
                    Some(Node::Literal(LiteralValue::String(name))) => {
                        self.names.insert(name.inner().to_string());
                    }
                    _ => self.all = true,
                }
            }
            Node::Ident(name) if name == "principal" => self.all = true,
            Node::Select(s) => self.walk(&s.operand),
            Node::Call(c) => {
                if let Some(t) = &c.target {
                    self.walk(t);
                }
                c.args.iter().for_each(|a| self.walk(a));
            }
            Node::Comprehension(c) => {
                for part in [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                    self.walk(part);
                }
            }
            Node::List(l) => l.elements.iter().for_each(|x| self.walk(x)),
            Node::Map(m) => m.entries.iter().for_each(|x| self.entry(&x.expr)),
            Node::Struct(s) => s.entries.iter().for_each(|x| self.entry(&x.expr)),
            Node::Ident(_) | Node::Literal(_) | Node::Unspecified => {}
        }
    }

    fn entry(&mut self, e: &EntryExpr) {
        match e {
            EntryExpr::StructField(f) => self.walk(&f.value),
            EntryExpr::MapEntry(m) => {
                self.walk(&m.key);
                self.walk(&m.value);
            }
        }
    }
}

/// The variables an expression uses that it does not bind itself (a macro's loop variables, such as `g` in
/// `principal.claims.groups.exists(g, g == "admin")`, are bound by it).
pub(crate) fn free_variables(e: &IdedExpr) -> BTreeSet<String> {
    fn walk(e: &IdedExpr, bound: &mut Vec<String>, out: &mut BTreeSet<String>) {
        match &e.expr {
            Node::Ident(n) => {
                if !n.starts_with('@') && !bound.contains(n) {
                    out.insert(n.clone());
                }
            }
            Node::Select(s) => walk(&s.operand, bound, out),
            Node::Call(c) => {
                if let Some(t) = &c.target {
                    walk(t, bound, out);
                }
                c.args.iter().for_each(|a| walk(a, bound, out));
            }
            Node::Comprehension(c) => {
                walk(&c.iter_range, bound, out);
                walk(&c.accu_init, bound, out);
                let before = bound.len();
                bound.push(c.iter_var.clone());
                bound.extend(c.iter_var2.clone());
                bound.push(c.accu_var.clone());
                for part in [&c.loop_cond, &c.loop_step, &c.result] {
                    walk(part, bound, out);
                }
                bound.truncate(before);
            }
            Node::List(l) => l.elements.iter().for_each(|x| walk(x, bound, out)),
            Node::Map(m) => m.entries.iter().for_each(|x| entry(&x.expr, bound, out)),
            Node::Struct(s) => s.entries.iter().for_each(|x| entry(&x.expr, bound, out)),
            Node::Literal(_) | Node::Unspecified => {}
        }
    }
    fn entry(e: &EntryExpr, bound: &mut Vec<String>, out: &mut BTreeSet<String>) {
        match e {
            EntryExpr::StructField(f) => walk(&f.value, bound, out),
            EntryExpr::MapEntry(m) => {
                walk(&m.key, bound, out);
                walk(&m.value, bound, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(e, &mut Vec::new(), &mut out);
    out
}

fn is_principal(e: &IdedExpr) -> bool {
    matches!(&e.expr, Node::Ident(n) if n == "principal")
}

fn is_claims(e: &IdedExpr) -> bool {
    matches!(&e.expr, Node::Select(s) if s.field == "claims" && is_principal(&s.operand))
}

#[cfg(test)]
mod tests {
    use crate::Policy;

    fn read(when: &str) -> (bool, Vec<String>) {
        let doc = format!("plans: {{ free: {{}} }}\ndefault: free\nassign: [ {{ when: '{when}', plan: free }} ]\n");
        let p = Policy::parse(&doc).expect("accepted");
        (p.claims.all, p.claims.names.into_iter().collect())
    }

    #[test]
    fn named_claims_are_found_and_anything_else_keeps_all() {
        assert_eq!(read(r#"principal.claims.plan == "pro""#), (false, vec!["plan".to_owned()]));
        assert_eq!(
            read(r#"has(principal.claims.tier) && principal.claims["org-id"] == "x" && principal.subject == "a""#),
            (false, vec!["org-id".to_owned(), "tier".to_owned()])
        );
        assert_eq!(read(r#"principal.issuer == "i""#), (false, vec![]));
        assert!(read(r#"principal.claims[principal.subject] == true"#).0);
        assert!(read(r#"size(principal.claims) > 3"#).0);
        assert!(read(r#"principal == {}"#).0);
        assert_eq!(read(r#"["a"].exists(x, principal.claims.groups == x)"#), (false, vec!["groups".to_owned()]));
        assert_eq!(
            read(r#"principal.claims.groups.exists(g, g == "admin")"#),
            (false, vec!["groups".to_owned()]),
            "a macro's own variable is not a variable of the rule"
        );
    }
}
