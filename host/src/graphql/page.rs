//! Relay-style connections over lists the domain returns whole.

use async_graphql::OutputType;
use async_graphql::connection::{Connection, Edge};

use super::limits;
use crate::{Error, Result};

/// The page of `items` after the item whose cursor is `after`, at most `first` long.
pub fn slice<T: OutputType>(
    items: Vec<T>,
    first: Option<i32>,
    after: Option<String>,
    cursor_of: impl Fn(&T) -> String,
) -> Result<Connection<String, T>> {
    let first = limits::page_size(first)?;
    let start = match after {
        None => 0,
        Some(after) => {
            items
                .iter()
                .position(|item| cursor_of(item) == after)
                .ok_or_else(|| Error::invalid("after", "not a cursor of this list"))?
                + 1
        }
    };
    let has_next = items.len() > start + first;
    let mut connection = Connection::new(start > 0, has_next);
    connection.edges.extend(
        items
            .into_iter()
            .skip(start)
            .take(first)
            .map(|item| Edge::new(cursor_of(&item), item)),
    );
    Ok(connection)
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
