//! Tenant IAM policies, written in Cedar and decided once per request on its attributes.
//!
//! The principal is the calling key (`Orl::Key::"key_…"` with `org` and `agent`), the action
//! the API permission (`Orl::Action::"compute:reservations:create"`), the resource the
//! reservation (`Orl::Reservation::"rsv_…"` with `tenant`), and the context the request's
//! attributes (`gpuModel`, `gpuCount`, `durationHours`, `region`, `vcpu`, `memoryGiB`,
//! `poolId`, `spot`) plus `confirmed`, which is true only when a person has approved.
//! An org without a policy allows whatever its keys' permissions allow. A refused agent
//! may be confirmed by a person when the policy would allow the same request `confirmed`.
//! A policy is validated against [`schema::SCHEMA`], the Cedar schema of that request, when
//! it is set.

mod schema;

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Entities, Entity, EntityUid, PolicySet, Request, RestrictedExpression,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{AnyConnection, Row as _};

use crate::App;
use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::iam::{Permission, Principal};
use crate::{Error, Result};

/// The attributes a decision sees.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attributes {
    pub gpu_model: String,
    pub gpu_count: i64,
    pub duration_hours: i64,
    pub region: String,
    pub vcpu: i64,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: i64,
    pub pool_id: String,
    pub spot: bool,
}

/// The outcome of one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    /// Denied to this agent, but a person may approve it.
    NeedsConfirmation,
}

/// Deepest nesting a policy may use: parentheses, sets and records, plus each `if` open
/// inside them. Cedar's parser recurses once per level, so this keeps a hostile policy from
/// exhausting the stack; a real policy nests a handful deep.
pub const MAX_NESTING: usize = 32;
/// Most operators one policy statement may chain (`&&`, `+`, `.`, `in`, …). The parser
/// turns a chain into a tree as deep as it is long, and dropping or evaluating that tree
/// recurses once per operator.
pub const MAX_OPERATORS: usize = 1_000;

/// Parses a policy, naming the first error. A policy nested deeper than [`MAX_NESTING`] or
/// chaining more than [`MAX_OPERATORS`] in one statement is refused before the parser
/// sees it.
pub fn parse(text: &str) -> Result<PolicySet> {
    check_shape(text)?;
    PolicySet::from_str(text)
        .map_err(|e| Error::invalid("policy", format!("not a valid Cedar policy: {e}")))
}

/// Refuses text nested deeper than [`MAX_NESTING`] or with more than [`MAX_OPERATORS`]
/// operators in one statement, scanning outside string literals and comments. Nesting
/// counts brackets, braces, parentheses and `if` keywords; an `if` counts as open until the
/// group around it closes (its `else` branch may hold the next one), so a chain of
/// `else if`s counts once per `if`. A run of operator characters counts as one operator.
fn check_shape(text: &str) -> Result<()> {
    let bytes = text.as_bytes();
    // The `if`s open in each enclosing group, and in the current one.
    let mut groups: Vec<usize> = Vec::new();
    let mut ifs = 0usize;
    let mut depth = 0usize;
    let mut operators = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => {
                groups.push(ifs);
                ifs = 0;
                depth += 1;
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1 + ifs);
                ifs = groups.pop().unwrap_or(0);
            }
            b';' if groups.is_empty() => {
                depth = depth.saturating_sub(ifs);
                ifs = 0;
                operators = 0;
            }
            b'.' => operators += 1,
            c if OPERATOR_CHARS.contains(&c) => {
                while bytes.get(i + 1).is_some_and(|c| OPERATOR_CHARS.contains(c)) {
                    i += 1;
                }
                operators += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                match &bytes[start..i] {
                    b"if" => {
                        ifs += 1;
                        depth += 1;
                    }
                    b"in" | b"has" | b"like" | b"is" => operators += 1,
                    _ => {}
                }
                if operators > MAX_OPERATORS {
                    return Err(too_many_operators());
                }
                continue;
            }
            _ => {}
        }
        if operators > MAX_OPERATORS {
            return Err(too_many_operators());
        }
        if depth > MAX_NESTING {
            return Err(Error::invalid(
                "policy",
                format!(
                    "nested too deep (at most {MAX_NESTING} levels of parentheses, sets, records and if-then-else)"
                ),
            ));
        }
        i += 1;
    }
    Ok(())
}

const OPERATOR_CHARS: &[u8] = b"&|=!<>+-*";

fn too_many_operators() -> Error {
    Error::invalid(
        "policy",
        format!("too long an expression (at most {MAX_OPERATORS} operators in one statement)"),
    )
}

fn uid(kind: &str, id: &str) -> Result<EntityUid> {
    EntityUid::from_str(&format!("Orl::{kind}::{}", json!(id)))
        .map_err(|e| anyhow::anyhow!("entity uid: {e}").into())
}

fn is_allowed(
    policies: &PolicySet,
    caller: &Principal,
    action: &str,
    resource: (&str, &str),
    attrs: &Attributes,
    confirmed: bool,
) -> Result<bool> {
    let principal = uid("Key", &caller.key_id)?;
    let resource_uid = uid("Reservation", resource.0)?;
    let key = Entity::new(
        principal.clone(),
        HashMap::from([
            (
                "org".to_string(),
                RestrictedExpression::new_string(caller.org_id.clone()),
            ),
            (
                "agent".to_string(),
                RestrictedExpression::new_bool(caller.agent),
            ),
        ]),
        HashSet::new(),
    )
    .map_err(|e| anyhow::anyhow!("principal entity: {e}"))?;
    let reservation = Entity::new(
        resource_uid.clone(),
        HashMap::from([(
            "tenant".to_string(),
            RestrictedExpression::new_string(resource.1.to_string()),
        )]),
        HashSet::new(),
    )
    .map_err(|e| anyhow::anyhow!("resource entity: {e}"))?;
    let schema = &*schema::SCHEMA;
    let entities = Entities::from_entities([key, reservation], Some(schema))
        .map_err(|e| anyhow::anyhow!("entities: {e}"))?;
    let mut context = serde_json::to_value(attrs).expect("attributes serialize");
    context["confirmed"] = Value::Bool(confirmed);
    let action = uid("Action", action)?;
    let context = Context::from_json_value(context, Some((schema, &action)))
        .map_err(|e| anyhow::anyhow!("context: {e}"))?;
    let request = Request::new(principal, action, resource_uid, context, Some(schema))
        .map_err(|e| anyhow::anyhow!("request: {e}"))?;
    Ok(Authorizer::new()
        .is_authorized(&request, policies, &entities)
        .decision()
        == cedar_policy::Decision::Allow)
}

/// Decides `action` on reservation `resource` (id, tenant) for `caller` under `policy`
/// (`None`: the org has no policy, so holding the permission allows).
pub fn decide(
    policy: Option<&str>,
    caller: &Principal,
    action: &str,
    resource: (&str, &str),
    attrs: &Attributes,
) -> Result<Decision> {
    let Some(text) = policy else {
        return Ok(Decision::Allow);
    };
    let policies = parse(text)?;
    if is_allowed(&policies, caller, action, resource, attrs, false)? {
        return Ok(Decision::Allow);
    }
    if caller.agent && is_allowed(&policies, caller, action, resource, attrs, true)? {
        return Ok(Decision::NeedsConfirmation);
    }
    Ok(Decision::Deny)
}

/// The org's policy text, if it has one.
pub async fn find(conn: &mut AnyConnection, org_id: &str) -> Result<Option<String>> {
    Ok(
        sqlx::query_scalar("SELECT policy FROM iam_policies WHERE org_id = $1")
            .bind(org_id)
            .fetch_optional(conn)
            .await?,
    )
}

/// An org's IAM policy as the API shows it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OrgPolicy {
    /// Cedar policy text.
    pub policy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

/// Sets the org's policy (its admins, or ops); an empty text removes it.
pub async fn put(
    app: &App,
    caller: &Principal,
    org_id: &str,
    body: OrgPolicy,
) -> Result<OrgPolicy> {
    caller.require_for(Permission::IamManage, org_id, format_args!("org {org_id}"))?;
    if body.policy.len() > 256 * 1024 {
        return Err(Error::invalid("policy", "at most 256 KiB"));
    }
    if crate::iam::orgs::find(app.store.pool(), org_id)
        .await?
        .is_none()
    {
        return Err(Error::not_found(format_args!("org {org_id}")));
    }
    let remove = body.policy.trim().is_empty();
    if !remove {
        schema::validate(&parse(&body.policy)?, &body.policy)?;
    }
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    sqlx::query("DELETE FROM iam_policies WHERE org_id = $1")
        .bind(org_id)
        .execute(&mut **tx)
        .await?;
    if !remove {
        sqlx::query("INSERT INTO iam_policies (org_id, policy, updated_at) VALUES ($1, $2, $3)")
            .bind(org_id)
            .bind(&body.policy)
            .bind(now)
            .execute(&mut **tx)
            .await?;
    }
    let entry = Entry {
        org_id,
        action: if remove {
            "iam-policy.remove"
        } else {
            "iam-policy.set"
        },
        object_type: "iam-policy",
        object_id: org_id,
        reason: None,
        details: Some(json!({ "policy": body.policy })),
    };
    audit::record(&mut tx, caller, entry, now).await?;
    tx.commit().await?;
    Ok(OrgPolicy {
        policy: body.policy,
        updated_at: Some(format_ms(now)),
    })
}

/// Reads the org's policy.
pub async fn get(app: &App, caller: &Principal, org_id: &str) -> Result<OrgPolicy> {
    caller.require_for(Permission::IamManage, org_id, format_args!("org {org_id}"))?;
    let row = sqlx::query("SELECT policy, updated_at FROM iam_policies WHERE org_id = $1")
        .bind(org_id)
        .fetch_optional(app.store.pool())
        .await?;
    Ok(match row {
        Some(r) => OrgPolicy {
            policy: r.get("policy"),
            updated_at: Some(format_ms(r.get("updated_at"))),
        },
        None => OrgPolicy {
            policy: String::new(),
            updated_at: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iam::Role;

    pub(super) const POLICY: &str = r#"
        permit(principal, action == Orl::Action::"compute:reservations:create", resource)
        when { context.gpuCount <= 4 && context.durationHours <= 24 };
        permit(principal, action == Orl::Action::"compute:reservations:create", resource)
        when { context.confirmed && context.gpuCount <= 16 };
    "#;

    fn caller(agent: bool) -> Principal {
        Principal {
            key_id: "key_1".into(),
            org_id: "tenant-a".into(),
            permissions: Role::Member.permissions(),
            agent,
        }
    }

    fn attrs(gpus: i64, hours: i64) -> Attributes {
        Attributes {
            gpu_count: gpus,
            duration_hours: hours,
            gpu_model: "H100".into(),
            ..Default::default()
        }
    }

    fn decide_create(agent: bool, gpus: i64) -> Decision {
        decide(
            Some(POLICY),
            &caller(agent),
            "compute:reservations:create",
            ("rsv_1", "tenant-a"),
            &attrs(gpus, 2),
        )
        .unwrap()
    }

    #[test]
    fn without_a_policy_the_permission_allows() {
        let d = decide(
            None,
            &caller(true),
            "compute:reservations:create",
            ("rsv_1", "t"),
            &attrs(64, 999),
        )
        .unwrap();
        assert_eq!(d, Decision::Allow);
    }

    #[test]
    fn the_policy_decides_on_the_request_attributes() {
        assert_eq!(decide_create(false, 4), Decision::Allow);
        assert_eq!(
            decide_create(false, 8),
            Decision::Deny,
            "a person is simply refused"
        );
        let long = decide(
            Some(POLICY),
            &caller(false),
            "compute:reservations:create",
            ("rsv_1", "t"),
            &attrs(2, 48),
        )
        .unwrap();
        assert_eq!(long, Decision::Deny);
    }

    #[test]
    fn a_refused_agent_may_be_confirmed_when_the_policy_allows_it_confirmed() {
        assert_eq!(decide_create(true, 8), Decision::NeedsConfirmation);
        assert_eq!(
            decide_create(true, 32),
            Decision::Deny,
            "not even with confirmation"
        );
        assert_eq!(decide_create(true, 2), Decision::Allow);
    }

    fn nested(open: &str, inner: &str, close: &str, depth: usize) -> String {
        format!(
            "permit(principal, action, resource) when {{ {}{inner}{} }};",
            open.repeat(depth),
            close.repeat(depth)
        )
    }

    fn refused_as_too_deep(text: &str) -> bool {
        parse(text).is_err_and(|e| e.to_string().contains("nested too deep"))
    }

    #[test]
    fn nesting_past_the_limit_is_refused_before_parsing() {
        let deep = MAX_NESTING + 1;
        assert!(refused_as_too_deep(&nested("(", "true", ")", deep)));
        assert!(refused_as_too_deep(&nested("(", "true", ")", 100_000)));
        assert!(refused_as_too_deep(&nested("[", "1", "] == []", deep)));
        assert!(refused_as_too_deep(&nested("{a:", "1", "}.a == 1", deep)));
        let mut ifs = "true".to_string();
        for _ in 0..deep {
            ifs = format!("if true then {ifs} else false");
        }
        assert!(refused_as_too_deep(&format!(
            "permit(principal, action, resource) when {{ {ifs} }};"
        )));
        let mut else_ifs = "true".to_string();
        for _ in 0..deep {
            else_ifs = format!("if false then false else {else_ifs}");
        }
        assert!(refused_as_too_deep(&format!(
            "permit(principal, action, resource) when {{ {else_ifs} }};"
        )));
    }

    #[test]
    fn nesting_within_the_limit_and_brackets_in_text_parse() {
        let inner = MAX_NESTING - 2;
        parse(&nested("(", "context.gpuCount <= 4", ")", inner)).unwrap();
        parse(&nested("[", "1", "] != []", inner)).unwrap();
        let text = format!(
            "// {}\npermit(principal, action, resource) when {{ context.region == \"{}\\\"\" }};",
            "(".repeat(100),
            "[".repeat(100)
        );
        parse(&text).unwrap();
        // `if`s closed by their group do not add up.
        let sequential = vec!["(if context.spot then true else false)"; 100].join(" && ");
        parse(&format!(
            "permit(principal, action, resource) when {{ {sequential} }};"
        ))
        .unwrap();
        parse(POLICY).unwrap();
    }

    #[test]
    fn long_chains_are_refused_and_chains_within_the_limit_decide_on_a_small_stack() {
        let when =
            |chain: String| format!("permit(principal, action, resource) when {{ {chain} }};");
        for (term, op) in [
            ("context.gpuCount <= 4", " && "),
            ("1", "+"),
            ("true", "||"),
        ] {
            let long = when(vec![term; 60_000].join(op));
            assert!(
                parse(&long).is_err_and(|e| e.to_string().contains("too long an expression")),
                "{op}"
            );
        }
        let dotted = when(format!("context{} == 1", ".a".repeat(MAX_OPERATORS + 1)));
        assert!(parse(&dotted).is_err());
        // Each statement has its own budget.
        let statement = when(vec!["context.gpuCount <= 4"; 300].join(" && "));
        let many = vec![statement.as_str(); 50].join("\n");
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                parse(&many).unwrap();
                let allowed = decide(
                    Some(&many),
                    &caller(false),
                    "compute:reservations:create",
                    ("rsv_1", "tenant-a"),
                    &attrs(2, 2),
                )
                .unwrap();
                assert_eq!(allowed, Decision::Allow);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_broken_policy_is_refused_with_its_error() {
        let err = parse("permit(principal, action, resource) when { context.x ==").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("policy: not a valid Cedar policy"),
            "{err}"
        );
    }
}
