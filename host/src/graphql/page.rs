//! Relay-style connections over pages the domain reads from the database.

use async_graphql::OutputType;
use async_graphql::connection::{Connection, Edge};

use super::limits;
use crate::{Result, validation};

/// The page size of a connection whose cursor is an id, and its `after`, checked: `first`
/// is 1-[`limits::MAX_PAGE_SIZE`] (default [`limits::DEFAULT_PAGE_SIZE`]).
pub fn by_id(first: Option<i32>, after: Option<&str>) -> Result<usize> {
    if let Some(after) = after {
        validation::id("after", after)?;
    }
    limits::page_size(first)
}

/// A connection of `items` read with one more than `first` (to tell whether more follow),
/// cut to `first`.
pub fn of_read<T: OutputType>(
    mut items: Vec<T>,
    first: usize,
    after_given: bool,
    cursor_of: impl Fn(&T) -> String,
) -> Connection<String, T> {
    let has_next = crate::store::cut(&mut items, first);
    of_page(items, after_given, has_next, cursor_of)
}

/// A connection of one page the domain cut, whose last item's cursor continues it.
pub fn of_page<T: OutputType>(
    items: Vec<T>,
    after_given: bool,
    has_next: bool,
    cursor_of: impl Fn(&T) -> String,
) -> Connection<String, T> {
    let mut connection = Connection::new(after_given, has_next);
    connection.edges.extend(
        items
            .into_iter()
            .map(|item| Edge::new(cursor_of(&item), item)),
    );
    connection
}
