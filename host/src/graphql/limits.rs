//! What one GraphQL operation may ask for: nesting depth, complexity (each field costs 1,
//! a connection's selection costs once per item asked for) and page size.

use crate::{Result, validation};

/// Deepest selection nesting; deep enough for GraphiQL's introspection query.
pub const MAX_DEPTH: usize = 16;
/// Most complexity points one operation may cost.
pub const MAX_COMPLEXITY: usize = 50_000;
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
