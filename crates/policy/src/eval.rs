//! Evaluating a checked policy: which plan a verified principal gets ([`Policy::assign`]), and whether its plan
//! lets a call through ([`Policy::check_call`]). CEL runs in process, over values built from the principal, the
//! tool and the validated arguments.
//!
//! An expression that fails to evaluate (a claim that is absent, a comparison of a string with a number) or yields
//! something other than a bool: in an assignment rule the rule does not apply (the next one is tried); in a call
//! condition the call is refused, as when the condition is false (fail closed: write `!has(args.limit) ||
//! args.limit <= 10` for an optional argument).

use crate::document::{Expr, Mode, Policy};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// What a rule sees of the caller: the verified token's issuer, subject and claims.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    pub claims: &'a serde_json::Map<String, Value>,
}

/// What a condition sees of the tool.
#[derive(Debug, Clone, Copy)]
pub struct ToolView<'a> {
    pub name: &'a str,
    /// The tool's annotations, as it lists them (`readOnlyHint`, …); `Value::Null` if none.
    pub annotations: &'a Value,
}

/// The plan a principal gets, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned<'p> {
    pub plan: &'p str,
    /// The index of the rule that picked it; `None`: the default.
    pub rule: Option<usize>,
    /// Dry-run rules that held before it (each would have picked its plan), with their plan.
    pub would: Vec<(usize, &'p str)>,
}

/// Whether a plan lets a call through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallVerdict<'p> {
    /// Allowed. `would_refuse`: the dry-run conditions that would have refused it.
    Allowed { would_refuse: Vec<usize> },
    /// The plan does not allow this tool (its `tools.allow` does not list it).
    NotAllowed,
    /// Condition `condition` refused it, with its message.
    Refused { condition: usize, message: &'p str },
}

impl Expr {
    /// Whether the expression holds in `ctx`: `Err` with why, when it fails or is not a bool.
    ///
    /// # Errors
    /// The evaluation error, or the type it yielded instead of a bool.
    pub fn holds(&self, ctx: &cel::Context<'_>) -> Result<bool, String> {
        match self.program.execute(ctx) {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("yields {:?}, not a bool", other.type_of())),
            Err(e) => Err(e.to_string()),
        }
    }
}

thread_local! {
    /// CEL's standard library, built once per thread: `cel::Context::default()` builds it on every call, which cost
    /// more than the evaluation itself (measured: `SET=policy tests/cost.sh`, docs/BENCHMARKS.md).
    static STDLIB: Arc<cel::Env> = Arc::new(cel::Env::stdlib());
}

/// A fresh context over the standard library, for one evaluation.
fn context() -> cel::Context<'static> {
    cel::Context::Root {
        functions: Default::default(),
        variables: Default::default(),
        resolver: None,
        env: STDLIB.with(Arc::clone),
    }
}

impl Policy {
    /// The plan of `who`: the first enforced rule whose `when` holds, else the default.
    #[must_use]
    pub fn assign(&self, who: &Subject<'_>) -> Assigned<'_> {
        let mut ctx = context();
        ctx.add_variable_from_value("principal", principal(who));
        let mut would = Vec::new();
        for (i, rule) in self.assign.iter().enumerate() {
            if rule.when.holds(&ctx) != Ok(true) {
                continue;
            }
            match rule.mode {
                Mode::Enforce => return Assigned { plan: &rule.plan, rule: Some(i), would },
                Mode::DryRun => would.push((i, rule.plan.as_str())),
            }
        }
        Assigned { plan: &self.default, rule: None, would }
    }

    /// The verdicts of plan `plan`'s conditions that depend on the principal alone (their expressions use no
    /// variable but `principal`), decided once for `who`, by condition: `Some(holds)`, or `None` for a condition
    /// that needs the call. Kept with the principal's plan when its token is verified, so that those conditions
    /// cost nothing per call ([`Policy::check_call`]).
    #[must_use]
    pub fn decide(&self, plan: &str, who: &Subject<'_>) -> Vec<Option<bool>> {
        let Some(p) = self.plans.get(plan) else { return Vec::new() };
        let decidable = |c: &crate::Condition| c.when.uses.iter().all(|u| u == "principal");
        if !p.conditions.iter().any(decidable) {
            return vec![None; p.conditions.len()];
        }
        let mut ctx = context();
        ctx.add_variable_from_value("principal", principal(who));
        p.conditions.iter().map(|c| decidable(c).then(|| c.when.holds(&ctx) == Ok(true))).collect()
    }

    /// Whether plan `plan` lets `who` call `tool` with `args` (already validated against the tool's schema). A plan
    /// that does not exist allows nothing. `decided`: verdicts from [`Policy::decide`] for this principal and plan
    /// (empty: none), used instead of evaluating those conditions again.
    #[must_use]
    pub fn check_call(
        &self,
        plan: &str,
        who: &Subject<'_>,
        tool: &ToolView<'_>,
        args: &serde_json::Map<String, Value>,
        decided: &[Option<bool>],
    ) -> CallVerdict<'_> {
        let Some(p) = self.plans.get(plan) else { return CallVerdict::NotAllowed };
        if p.allow.as_ref().is_some_and(|allow| !allow.iter().any(|t| t == tool.name)) {
            return CallVerdict::NotAllowed;
        }
        let known = |i: usize| decided.get(i).copied().flatten();
        let applies = |c: &crate::Condition| c.tool.as_deref().is_none_or(|t| t == tool.name);
        // Only the variables the conditions left to evaluate use are built (each is a map to allocate, per call).
        let pending: Vec<usize> =
            (0..p.conditions.len()).filter(|&i| applies(&p.conditions[i]) && known(i).is_none()).collect();
        let uses = |v: &str| pending.iter().any(|&i| p.conditions[i].when.uses.iter().any(|u| u == v));
        let mut ctx = context();
        if uses("principal") {
            ctx.add_variable_from_value("principal", principal(who));
        }
        if uses("tool") {
            ctx.add_variable_from_value(
                "tool",
                to_cel(&serde_json::json!({ "name": tool.name, "annotations": tool.annotations })),
            );
        }
        if uses("args") {
            let args: HashMap<String, cel::Value> = args.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            ctx.add_variable_from_value("args", args);
        }
        let mut would_refuse = Vec::new();
        for (i, c) in p.conditions.iter().enumerate() {
            if !applies(c) || known(i).unwrap_or_else(|| c.when.holds(&ctx) == Ok(true)) {
                continue;
            }
            match c.mode {
                Mode::Enforce => return CallVerdict::Refused { condition: i, message: &c.message },
                Mode::DryRun => would_refuse.push(i),
            }
        }
        CallVerdict::Allowed { would_refuse }
    }
}

/// `principal` as rules see it: `issuer`, `subject`, `claims`.
fn principal(who: &Subject<'_>) -> cel::Value {
    let mut m: HashMap<String, cel::Value> = HashMap::new();
    m.insert("issuer".to_owned(), cel::Value::String(Arc::new(who.issuer.to_owned())));
    m.insert("subject".to_owned(), cel::Value::String(Arc::new(who.subject.to_owned())));
    let claims: HashMap<String, cel::Value> = who.claims.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
    m.insert("claims".to_owned(), claims.into());
    m.into()
}

/// A JSON value as CEL sees it: integers as `int` (or `uint` above `i64`), other numbers as `double`.
fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => n.as_i64().map_or_else(
            || n.as_u64().map_or_else(|| cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)), cel::Value::UInt),
            cel::Value::Int,
        ),
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(o) => {
            let m: HashMap<String, cel::Value> = o.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            m.into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DOC: &str = r#"
plans:
  free:
    tools:
      allow: [search, get]
      conditions:
        - tool: search
          when: '!has(args.limit) || args.limit <= 10'
          message: at most 10 on the free plan
        - when: 'principal.claims.region == "eu"'
          message: EU only
          mode: dry-run
  pro: {}
  staff: {}
assign:
  - when: 'principal.claims.staff == true'
    plan: staff
    mode: dry-run
  - when: 'principal.claims.plan == "pro" && principal.issuer == "https://id.example"'
    plan: pro
default: free
"#;

    fn claims(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn args(v: Value) -> serde_json::Map<String, Value> {
        claims(v)
    }

    #[test]
    fn the_first_enforced_rule_that_holds_picks_the_plan() {
        let p = Policy::parse(DOC).expect("accepted");
        let pro = claims(json!({ "plan": "pro", "staff": true }));
        let who = Subject { issuer: "https://id.example", subject: "alice", claims: &pro };
        assert_eq!(p.assign(&who), Assigned { plan: "pro", rule: Some(1), would: vec![(0, "staff")] });
        // Another issuer: the rule does not hold; a missing claim is no match, not a failure.
        let other = Subject { issuer: "https://other", ..who };
        assert_eq!(p.assign(&other).plan, "free");
        let none = claims(json!({}));
        assert_eq!(p.assign(&Subject { claims: &none, ..who }), Assigned { plan: "free", rule: None, would: vec![] });
        // A claim of another type: the comparison fails, the rule does not apply.
        let odd = claims(json!({ "plan": 7 }));
        assert_eq!(p.assign(&Subject { claims: &odd, ..who }).plan, "free");
    }

    #[test]
    fn a_plans_tools_and_conditions_decide_a_call_after_validation() {
        let p = Policy::parse(DOC).expect("accepted");
        let c = claims(json!({ "region": "us" }));
        let who = Subject { issuer: "i", subject: "bob", claims: &c };
        let search = ToolView { name: "search", annotations: &Value::Null };
        assert_eq!(
            p.check_call("free", &who, &search, &args(json!({ "limit": 10 })), &[]),
            CallVerdict::Allowed { would_refuse: vec![1] },
            "the dry run would refuse (not EU), and lets it through"
        );
        assert_eq!(
            p.check_call("free", &who, &search, &args(json!({})), &[]),
            CallVerdict::Allowed { would_refuse: vec![1] }
        );
        assert_eq!(
            p.check_call("free", &who, &search, &args(json!({ "limit": 11 })), &[]),
            CallVerdict::Refused { condition: 0, message: "at most 10 on the free plan" }
        );
        // A value the expression cannot compare: refused (fail closed).
        assert!(matches!(
            p.check_call("free", &who, &search, &args(json!({ "limit": "ten" })), &[]),
            CallVerdict::Refused { .. }
        ));
        let other = ToolView { name: "delete", annotations: &Value::Null };
        assert_eq!(p.check_call("free", &who, &other, &args(json!({})), &[]), CallVerdict::NotAllowed);
        assert_eq!(
            p.check_call("pro", &who, &other, &args(json!({})), &[]),
            CallVerdict::Allowed { would_refuse: vec![] }
        );
        assert_eq!(p.check_call("gold", &who, &other, &args(json!({})), &[]), CallVerdict::NotAllowed);
    }

    #[test]
    fn conditions_on_the_principal_alone_are_decided_once_and_used_as_decided() {
        let p = Policy::parse(DOC).expect("accepted");
        let (eu, us) = (claims(json!({ "region": "eu" })), claims(json!({ "region": "us" })));
        let who = |c| Subject { issuer: "i", subject: "bob", claims: c };
        // Condition 0 reads args (left for the call); condition 1 reads the principal only.
        assert_eq!(p.decide("free", &who(&eu)), vec![None, Some(true)]);
        assert_eq!(p.decide("free", &who(&us)), vec![None, Some(false)]);
        assert_eq!(p.decide("pro", &who(&us)), Vec::<Option<bool>>::new());
        let search = ToolView { name: "search", annotations: &Value::Null };
        // What was decided stands for the call, whatever the principal presented then.
        assert_eq!(
            p.check_call("free", &who(&us), &search, &args(json!({ "limit": 5 })), &[None, Some(true)]),
            CallVerdict::Allowed { would_refuse: vec![] }
        );
        assert_eq!(
            p.check_call("free", &who(&eu), &search, &args(json!({ "limit": 11 })), &[None, Some(true)]),
            CallVerdict::Refused { condition: 0, message: "at most 10 on the free plan" }
        );
    }

    #[test]
    fn json_becomes_cel_values() {
        assert_eq!(to_cel(&json!(3)), cel::Value::Int(3));
        assert_eq!(to_cel(&json!(u64::MAX)), cel::Value::UInt(u64::MAX));
        assert_eq!(to_cel(&json!(1.5)), cel::Value::Float(1.5));
        assert_eq!(to_cel(&json!(null)), cel::Value::Null);
        assert!(matches!(to_cel(&json!([1, "a"])), cel::Value::List(l) if l.len() == 2));
    }
}
