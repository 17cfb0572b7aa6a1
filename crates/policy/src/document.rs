//! The policy document: parsed from YAML (duplicate keys refused), checked against its published JSON Schema
//! (`docs/policy.schema.json`: every object closed, every number bounded), then typed, its CEL expressions compiled
//! and its references resolved. Any refusal refuses the whole document, with the JSON pointer of the place.

use crate::PolicyError;
use mcpfleet_core::{Quota, parse_duration};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// The document's JSON Schema, as published.
pub const SCHEMA: &str = include_str!("../../../docs/policy.schema.json");

/// How long a document may be: a policy is configuration, not data.
pub const MAX_BYTES: usize = 1 << 20;

/// A checked policy: every expression compiled, every reference resolved.
#[derive(Debug, Clone)]
pub struct Policy {
    pub plans: BTreeMap<String, Plan>,
    pub assign: Vec<Assign>,
    pub default: String,
    pub tenants: Tenants,
    /// The document as checked (JSON), for comparing versions ([`Policy::changes`]).
    pub document: Value,
    /// The claims its rules read: what a verifier keeps of a token ([`Policy::claims_read`]).
    pub claims: crate::ClaimsRead,
}

/// One plan: its limits (a number left out takes the flag's value) and its tools.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub rate_per_second: Option<f64>,
    pub rate_burst: Option<u64>,
    pub inflight: Option<u64>,
    pub sessions: Option<u64>,
    pub streams: Option<u64>,
    pub tasks: Option<u64>,
    pub quotas: BTreeMap<String, Quota>,
    /// The tools the plan may list and call; `None`: every tool.
    pub allow: Option<Vec<String>>,
    pub conditions: Vec<Condition>,
}

/// A rule that picks a plan.
#[derive(Debug, Clone)]
pub struct Assign {
    pub when: Expr,
    pub plan: String,
    pub mode: Mode,
}

/// A condition on a plan's calls, checked after the arguments are validated.
#[derive(Debug, Clone)]
pub struct Condition {
    /// The tool it applies to; `None`: every tool.
    pub tool: Option<String>,
    pub when: Expr,
    pub message: String,
    pub mode: Mode,
}

/// Quotas a tenant's users share.
#[derive(Debug, Clone, Default)]
pub struct Tenants {
    pub quotas: BTreeMap<String, Quota>,
    pub overrides: BTreeMap<String, BTreeMap<String, Quota>>,
}

/// Whether a rule refuses, or only says it would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Enforce,
    DryRun,
}

/// A compiled CEL expression and its source.
#[derive(Clone)]
pub struct Expr {
    pub source: String,
    pub program: Arc<cel::Program>,
    /// The variables it uses (of `principal`, `tool`, `args`): an evaluation builds only these.
    pub uses: Vec<String>,
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Expr").field(&self.source).finish()
    }
}

/// The variables a rule's expression may use.
const ASSIGN_VARIABLES: &[&str] = &["principal"];
const CONDITION_VARIABLES: &[&str] = &["principal", "tool", "args"];

// The document as written (the schema has already refused anything else).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    plans: BTreeMap<String, RawPlan>,
    #[serde(default)]
    assign: Vec<RawAssign>,
    default: String,
    #[serde(default)]
    tenants: RawTenants,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    #[serde(default)]
    rate: RawRate,
    inflight: Option<u64>,
    sessions: Option<u64>,
    streams: Option<u64>,
    tasks: Option<u64>,
    #[serde(default)]
    quotas: BTreeMap<String, RawQuota>,
    #[serde(default)]
    tools: RawTools,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRate {
    per_second: Option<f64>,
    burst: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuota {
    limit: u64,
    window: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTools {
    allow: Option<Vec<String>>,
    #[serde(default)]
    conditions: Vec<RawCondition>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCondition {
    tool: Option<String>,
    when: String,
    message: String,
    #[serde(default)]
    mode: Mode,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAssign {
    when: String,
    plan: String,
    #[serde(default)]
    mode: Mode,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTenants {
    #[serde(default)]
    quotas: BTreeMap<String, RawQuota>,
    #[serde(default)]
    overrides: BTreeMap<String, RawOverride>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    quotas: BTreeMap<String, RawQuota>,
}

/// The schema, compiled once (`None` if it did not compile, which the crate's tests rule out).
fn validator() -> Option<&'static jsonschema::Validator> {
    static V: OnceLock<Option<jsonschema::Validator>> = OnceLock::new();
    V.get_or_init(|| serde_json::from_str(SCHEMA).ok().and_then(|s: Value| jsonschema::draft202012::new(&s).ok()))
        .as_ref()
}

impl Policy {
    /// Parses and checks a policy document (YAML, or JSON, which is YAML).
    ///
    /// # Errors
    /// The first [`PolicyError`]: the whole document is refused.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        if text.len() > MAX_BYTES {
            return Err(PolicyError::Syntax(format!(
                "{} bytes, more than the {MAX_BYTES} a document may have",
                text.len()
            )));
        }
        let value: Value =
            serde_saphyr::from_str(text).map_err(|e| PolicyError::Syntax(yaml_message(&e.to_string())))?;
        Self::from_value(value)
    }

    /// Checks a document already read as JSON.
    ///
    /// # Errors
    /// The first [`PolicyError`].
    pub fn from_value(value: Value) -> Result<Self, PolicyError> {
        let v = validator().ok_or_else(|| PolicyError::Schema {
            pointer: String::new(),
            expected: "a document this build's schema can check (it does not compile)".to_owned(),
        })?;
        if let Some(e) = v.iter_errors(&value).next() {
            let (pointer, expected) = mcpfleet_tools::validate::refusal(&e);
            return Err(PolicyError::Schema { pointer, expected });
        }
        let raw = RawPolicy::deserialize(&value)
            .map_err(|e| PolicyError::Schema { pointer: String::new(), expected: e.to_string() })?;
        raw.check(value)
    }
}

impl RawPolicy {
    fn check(self, document: Value) -> Result<Policy, PolicyError> {
        let mut plans = BTreeMap::new();
        for (name, p) in self.plans {
            let at = format!("/plans/{}", mcpfleet_tools::validate::pointer_token(&name));
            let mut conditions = Vec::new();
            for (i, c) in p.tools.conditions.into_iter().enumerate() {
                let at = format!("{at}/tools/conditions/{i}");
                if let (Some(tool), Some(allow)) = (&c.tool, &p.tools.allow)
                    && !allow.contains(tool)
                {
                    return Err(PolicyError::Reference {
                        pointer: format!("{at}/tool"),
                        message: format!("{tool:?} is not in the plan's tools.allow: the condition could never apply"),
                    });
                }
                let when = compile(&c.when, &format!("{at}/when"), CONDITION_VARIABLES)?;
                conditions.push(Condition { tool: c.tool, when, message: c.message, mode: c.mode });
            }
            let plan = Plan {
                rate_per_second: p.rate.per_second,
                rate_burst: p.rate.burst,
                inflight: p.inflight,
                sessions: p.sessions,
                streams: p.streams,
                tasks: p.tasks,
                quotas: quotas(p.quotas, &format!("{at}/quotas"))?,
                allow: p.tools.allow,
                conditions,
            };
            plans.insert(name, plan);
        }
        let known = |name: &str, pointer: String| {
            if plans.contains_key(name) {
                Ok(())
            } else {
                let names: Vec<&str> = plans.keys().map(String::as_str).collect();
                Err(PolicyError::Reference {
                    pointer,
                    message: format!("no plan {name:?} (plans: {})", names.join(", ")),
                })
            }
        };
        known(&self.default, "/default".to_owned())?;
        let mut assign = Vec::new();
        for (i, a) in self.assign.into_iter().enumerate() {
            known(&a.plan, format!("/assign/{i}/plan"))?;
            let when = compile(&a.when, &format!("/assign/{i}/when"), ASSIGN_VARIABLES)?;
            assign.push(Assign { when, plan: a.plan, mode: a.mode });
        }
        let mut overrides = BTreeMap::new();
        for (tenant, o) in self.tenants.overrides {
            let at = format!("/tenants/overrides/{}/quotas", mcpfleet_tools::validate::pointer_token(&tenant));
            overrides.insert(tenant, quotas(o.quotas, &at)?);
        }
        let tenants = Tenants { quotas: quotas(self.tenants.quotas, "/tenants/quotas")?, overrides };
        let exprs =
            assign.iter().map(|a| &a.when).chain(plans.values().flat_map(|p| p.conditions.iter().map(|c| &c.when)));
        let claims = crate::ClaimsRead::of(exprs);
        Ok(Policy { plans, assign, default: self.default, tenants, document, claims })
    }
}

/// Typed quotas: each window a duration the flags take too (1 ms to 30 days).
fn quotas(raw: BTreeMap<String, RawQuota>, at: &str) -> Result<BTreeMap<String, Quota>, PolicyError> {
    raw.into_iter()
        .map(|(tool, q)| {
            let window = parse_duration(&q.window).map_err(|_| PolicyError::Schema {
                pointer: format!("{at}/{}/window", mcpfleet_tools::validate::pointer_token(&tool)),
                expected: "a window of 1ms to 30d".to_owned(),
            })?;
            Ok((tool, Quota { limit: q.limit, window }))
        })
        .collect()
}

/// Compiles `source`, which may use only `variables`.
fn compile(source: &str, pointer: &str, variables: &[&str]) -> Result<Expr, PolicyError> {
    let program = cel::Program::compile(source).map_err(|e| PolicyError::Expression {
        pointer: pointer.to_owned(),
        message: format!("does not compile: {}", cel_message(&e.to_string())),
    })?;
    let free = crate::claims::free_variables(program.expression());
    if let Some(v) = free.iter().find(|v| !variables.contains(&v.as_str())) {
        return Err(PolicyError::Expression {
            pointer: pointer.to_owned(),
            message: format!("uses {v:?}, which this rule does not have (it has: {})", variables.join(", ")),
        });
    }
    let uses = free.into_iter().collect();
    Ok(Expr { source: source.to_owned(), program: Arc::new(program), uses })
}

/// A message on one line, at most 400 characters (errors are one line everywhere).
fn one_line(s: &str) -> String {
    let line: String = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
    line.chars().take(400).collect()
}

/// The YAML parser's message without its snippet of the input and its advice to the programmer: `line 3 column 1:
/// duplicate mapping key: default`.
fn yaml_message(s: &str) -> String {
    let s = one_line(s);
    let s = s.split(" --> ").next().unwrap_or_default();
    let s = s.strip_prefix("error: ").unwrap_or(s);
    s.replace(", set DuplicateKeyPolicy in Options if acceptable", "")
}

/// CEL's message without the echo of the expression: `1:25: Syntax error: mismatched input …`.
fn cel_message(s: &str) -> String {
    let s = one_line(s);
    let s = s.split(" | ").next().unwrap_or_default();
    s.strip_prefix("ERROR: <input>:").unwrap_or(s).to_owned()
}
