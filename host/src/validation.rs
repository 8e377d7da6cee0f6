//! Input rules shared by every surface. Each check names the field it rejects.

use std::sync::LazyLock;

use regex::Regex;

use crate::{Error, Result};

/// `^[A-Za-z0-9._:-]{1,128}$`: org, node, unit, tenant ids and idempotency keys.
pub static ID: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[A-Za-z0-9._:-]{1,128}$").unwrap());

/// Org, node, unit and other caller-chosen ids: `^[A-Za-z0-9._:-]{1,128}$`.
pub fn id(field: &str, value: &str) -> Result<()> {
    if ID.is_match(value) {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!(
                "{:?} is not a valid id (1-128 characters of A-Z a-z 0-9 . _ : -)",
                truncate(value)
            ),
        ))
    }
}

/// Free text such as names and reasons: at most `max` characters, no control characters.
pub fn text(field: &str, value: &str, max: usize) -> Result<()> {
    if value.chars().count() > max {
        return Err(Error::invalid(field, format!("at most {max} characters")));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// Optional free text.
pub fn opt_text(field: &str, value: Option<&str>, max: usize) -> Result<()> {
    value.map_or(Ok(()), |v| text(field, v, max))
}

/// An integer within `[min, max]`.
pub fn range(field: &str, value: i64, min: i64, max: i64) -> Result<()> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("must be {min}-{max}, got {value}"),
        ))
    }
}

fn truncate(value: &str) -> String {
    value.chars().take(40).collect()
}

/// A list of distinct unit ids: at least one, at most a node's worth, each a valid id.
pub fn unit_ids(field: &str, unit_ids: &[String]) -> Result<()> {
    let max = crate::inventory::MAX_UNITS;
    if unit_ids.is_empty() {
        return Err(Error::invalid(field, "must name at least one unit"));
    }
    if unit_ids.len() > max {
        return Err(Error::invalid(field, format!("at most {max} units")));
    }
    for (i, id) in unit_ids.iter().enumerate() {
        self::id(&format!("{field}[{i}]"), id)?;
        if unit_ids[..i].contains(id) {
            return Err(Error::invalid(
                format!("{field}[{i}]"),
                format!("duplicate unit id {id:?}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_pattern() {
        assert!(id("orgId", "acme-gpu.eu:1_a").is_ok());
        assert!(id("orgId", "").is_err());
        assert!(id("orgId", "has space").is_err());
        assert!(id("orgId", &"a".repeat(128)).is_ok());
        let err = id("orgId", &"a".repeat(129)).unwrap_err();
        assert!(err.to_string().starts_with("orgId:"), "{err}");
    }

    #[test]
    fn text_is_bounded() {
        assert!(text("reason", "ok", 10).is_ok());
        assert!(text("reason", "too long!!!", 10).is_err());
        assert!(text("reason", "bell\u{7}", 10).is_err());
    }
}
