//! What one GraphQL operation may ask for: nesting depth, complexity (each field costs 1,
//! a connection's selection costs once per item asked for) and page size; and what it may
//! be before those are computed (size, nesting, fields with fragments expanded), which
//! [`super::guard`] checks so that no operation costs more to refuse than to run.

use crate::{Result, validation};

/// Deepest selection nesting; deep enough for GraphiQL's introspection query.
pub const MAX_DEPTH: usize = 16;
/// Most complexity points one operation may cost.
pub const MAX_COMPLEXITY: usize = 50_000;
/// Largest request body `/graphql` accepts, and largest WebSocket message.
pub const MAX_BODY_BYTES: usize = 256 << 10;
/// Longest query text.
pub const MAX_QUERY_BYTES: usize = 32 << 10;
/// Deepest nesting of braces, parentheses and brackets in the text, and of selections
/// with fragments expanded (spreads and inline fragments count as levels).
pub const MAX_NESTING: usize = 32;
/// Most fields one operation selects with its fragments expanded (GraphiQL's
/// introspection query selects about 250).
pub const MAX_SELECTIONS: usize = 1_000;
/// Most fields at the root of one operation, through fragments: each is resolved on its
/// own.
pub const MAX_ROOT_FIELDS: usize = 32;
/// Most introspection fields (`__schema`, `__type`) at the root of one operation: each
/// lists the schema's types however few fields it selects, so aliases would multiply that.
pub const MAX_INTROSPECTION_FIELDS: usize = 4;
/// Most fragments one document defines.
pub const MAX_FRAGMENTS: usize = 100;
/// Most directives on one field (checked by [`super::guard`]; the schema's own check
/// expands fragments).
pub const MAX_DIRECTIVES: usize = 8;
/// Largest `first` of any connection.
pub const MAX_PAGE_SIZE: i32 = 500;
/// `first` when a connection is asked without it.
pub const DEFAULT_PAGE_SIZE: i32 = 50;

/// The page size asked for, validated against [`MAX_PAGE_SIZE`].
pub fn page_size(first: Option<i32>) -> Result<usize> {
    let first = first.unwrap_or(DEFAULT_PAGE_SIZE);
    validation::range("first", i64::from(first), 1, i64::from(MAX_PAGE_SIZE))?;
    Ok(first as usize)
}

/// A connection's complexity: its selection once per item it may return.
pub fn connection_cost(first: Option<i32>, child: usize) -> usize {
    let items = first.map_or(DEFAULT_PAGE_SIZE, |f| f.clamp(1, MAX_PAGE_SIZE)) as usize;
    items.saturating_mul(child).saturating_add(1)
}
