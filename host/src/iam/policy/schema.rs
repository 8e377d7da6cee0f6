//! The Cedar schema of exactly what orl sends to a decision: the entity types, the actions
//! and the context attributes. A policy is validated against it when it is set, so a typo
//! (`context.gpuModelx`) is refused then instead of silently never matching; every decision
//! builds its request against it too, so the schema cannot drift from what is sent.

use std::sync::LazyLock;

use cedar_policy::{PolicySet, Schema, ValidationError, ValidationMode, Validator};
use miette::Diagnostic as _;

use crate::{Error, Result};

/// The schema in Cedar's schema syntax. The context is [`super::Attributes`] plus
/// `confirmed`; the actions are the permissions a decision is made for.
pub const TEXT: &str = r#"namespace Orl {
  // The API key that calls.
  entity Key = { "org": String, "agent": Bool };
  // The compute reservation the request is about.
  entity Reservation = { "tenant": String };
  type Request = {
    "gpuModel": String,
    "gpuCount": Long,
    "durationHours": Long,
    "region": String,
    "vcpu": Long,
    "memoryGiB": Long,
    "poolId": String,
    "spot": Bool,
    "confirmed": Bool,
  };
  action "compute:reservations:create", "compute:reservations:read", "compute:reservations:extend"
    appliesTo { principal: Key, resource: Reservation, context: Request };
}
"#;

/// The parsed schema, shared by every decision.
pub static SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
    Schema::from_cedarschema_str(TEXT)
        .expect("the built-in schema parses")
        .0
});

static VALIDATOR: LazyLock<Validator> = LazyLock::new(|| Validator::new(SCHEMA.clone()));

/// Refuses `policies` (parsed from `text`) when one of them does not type-check against
/// [`SCHEMA`] in strict mode: an unknown entity type, action or attribute, or an attribute
/// used as the wrong type. The message names the first problem, its line and Cedar's
/// suggestion, and how many more there are.
pub fn validate(policies: &PolicySet, text: &str) -> Result<()> {
    let result = VALIDATOR.validate(policies, ValidationMode::Strict);
    let mut errors = result.validation_errors();
    let Some(first) = errors.next() else {
        return Ok(());
    };
    let more = errors.count();
    let mut message = format!(
        "does not fit the request orl sends: {}",
        describe(first, text)
    );
    if more > 0 {
        message.push_str(&format!(" (and {more} more)"));
    }
    Err(Error::invalid("policy", message))
}

/// One validation error with the line it is on and Cedar's suggestion, if any.
fn describe(error: &ValidationError, text: &str) -> String {
    let mut out = error.to_string();
    let offset = error
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|l| l.offset());
    if let Some(offset) = offset.filter(|o| *o <= text.len()) {
        let line = text[..offset].matches('\n').count() + 1;
        out.push_str(&format!(", at line {line}"));
    }
    if let Some(help) = error.help() {
        out.push_str(&format!(" ({help})"));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::str::FromStr as _;

    use super::*;
    use crate::iam::Permission;
    use crate::iam::policy::Attributes;

    fn check(text: &str) -> Result<()> {
        validate(&PolicySet::from_str(text).unwrap(), text)
    }

    fn refusal(text: &str) -> String {
        check(text).unwrap_err().to_string()
    }

    #[test]
    fn the_context_is_exactly_the_attributes_orl_sends() {
        let mut sent: Vec<String> = serde_json::to_value(Attributes::default())
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        sent.push("confirmed".into());
        for attribute in &sent {
            check(&format!(
                "permit(principal, action, resource) when {{ context has {attribute} }};"
            ))
            .unwrap();
        }
        let declared = TEXT
            .split_once("type Request = {")
            .unwrap()
            .1
            .split_once('}')
            .unwrap()
            .0
            .matches(':')
            .count();
        assert_eq!(
            declared,
            sent.len(),
            "the schema declares no more than is sent"
        );
    }

    #[test]
    fn the_actions_are_the_permissions_decided() {
        for permission in [
            Permission::ComputeCreate,
            Permission::ComputeRead,
            Permission::ComputeExtend,
        ] {
            let action = permission.as_str();
            check(&format!(
                r#"permit(principal, action == Orl::Action::"{action}", resource);"#
            ))
            .unwrap();
        }
        let message = refusal(
            r#"permit(principal, action == Orl::Action::"compute:reservations:release", resource);"#,
        );
        assert!(
            message.contains("compute:reservations:release"),
            "{message}"
        );
    }

    #[test]
    fn an_attribute_orl_never_sends_is_refused_with_its_name_and_line() {
        let message =
            refusal("permit(principal, action, resource)\nwhen { context.gpuModelx == \"H100\" };");
        assert!(message.starts_with("policy: "), "{message}");
        assert!(message.contains("gpuModelx"), "{message}");
        assert!(message.contains("line 2"), "{message}");
        assert!(message.contains("gpuModel`"), "the suggestion: {message}");
        for (text, name) in [
            (
                "permit(principal, action, resource) when { principal.orgId == \"a\" };",
                "orgId",
            ),
            (
                "permit(principal, action, resource) when { resource.owner == \"a\" };",
                "owner",
            ),
            (
                "permit(principal == Orl::User::\"u\", action, resource);",
                "Orl::User",
            ),
        ] {
            let message = refusal(text);
            assert!(message.contains(name), "{name}: {message}");
        }
    }

    #[test]
    fn an_attribute_used_as_the_wrong_type_is_refused() {
        let message = refusal(
            "permit(principal, action, resource) when { context.gpuCount == \"4\" };\n\
             permit(principal, action, resource) when { context.spot > 1 };",
        );
        assert!(message.contains("and 1 more"), "{message}");
    }

    #[test]
    fn the_longest_statement_allowed_validates_on_a_small_stack() {
        // Each term is three operators: `.`, `<=` and the `&&` after it.
        let terms = super::super::MAX_OPERATORS / 3;
        let chain = vec!["context.gpuCount <= 4"; terms].join(" && ");
        let text = format!("permit(principal, action, resource) when {{ {chain} }};");
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || validate(&super::super::parse(&text).unwrap(), &text).unwrap())
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn the_documented_policies_fit() {
        check(super::super::tests::POLICY).unwrap();
        check(include_str!("../../../../examples/policy.cedar")).unwrap();
        let readme = include_str!("../../../../README.md");
        let cedar = readme.split("```cedar\n").skip(1);
        let blocks: Vec<&str> = cedar.map(|b| b.split("```").next().unwrap()).collect();
        assert!(!blocks.is_empty(), "the README shows a policy");
        for block in blocks {
            check(block).unwrap();
        }
    }
}
