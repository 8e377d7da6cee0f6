//! Bounds what an operation costs before the expensive steps see it. The text is scanned
//! (size, bracket nesting) before the parser, whose recursion would otherwise follow a
//! hostile nesting down the stack; the parsed document is measured with its fragments
//! expanded (selections, root fields, nesting through spreads) before validation, whose
//! checks would otherwise expand a fragment fan-out exponentially. Strings with a NUL
//! character are refused as `INVALID_INPUT`: no id or text the platform stores has one.

use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextParseQuery};
use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use async_graphql::{ErrorExtensions as _, Pos, ServerError, ServerResult, Value, Variables};

use super::limits::{
    MAX_DIRECTIVES, MAX_FRAGMENTS, MAX_INTROSPECTION_FIELDS, MAX_NESTING, MAX_QUERY_BYTES,
    MAX_ROOT_FIELDS, MAX_SELECTIONS,
};

/// The extension that applies the bounds to every operation, over HTTP and WebSocket.
pub struct Guard;

impl ExtensionFactory for Guard {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Guard)
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for Guard {
    async fn parse_query(
        &self,
        _ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        _next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        scan(query)?;
        for (name, value) in variables.iter() {
            if has_nul(value) {
                return Err(nul(name.as_str(), None));
            }
        }
        // Parsed here rather than by `next`: the schema's own post-parse checks (recursion
        // depth, directives) walk the document with every fragment spread expanded, which
        // for a fan-out of spreads is exponential. `measure` checks both, linearly.
        let document = async_graphql::parser::parse_query(query)?;
        measure(&document)?;
        Ok(document)
    }
}

fn too_complex(message: impl std::fmt::Display) -> ServerError {
    ServerError::new(format!("Query is too complex: {message}."), None)
}

fn nul(field: &str, pos: Option<Pos>) -> ServerError {
    let message = format!("{field}: must not contain a NUL character");
    let error = async_graphql::Error::new(message.clone()).extend_with(|_, e| {
        e.set("code", "INVALID_INPUT");
        e.set("details", async_graphql::value!({ "field": field }));
    });
    let mut server_error = ServerError::new(message, pos);
    server_error.extensions = error.extensions;
    server_error
}

/// Refuses a query text longer than [`MAX_QUERY_BYTES`] or with brackets nested deeper
/// than [`MAX_NESTING`] (outside strings and comments), without parsing it.
fn scan(query: &str) -> ServerResult<()> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(ServerError::new(
            format!(
                "Query is too large: {} bytes, at most {MAX_QUERY_BYTES}.",
                query.len()
            ),
            None,
        ));
    }
    let bytes = query.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' if bytes[i..].starts_with(b"\"\"\"") => {
                i += 3;
                while i < bytes.len() && !bytes[i..].starts_with(b"\"\"\"") {
                    i += if bytes[i..].starts_with(b"\\\"\"\"") {
                        4
                    } else {
                        1
                    };
                }
                i += 2;
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'{' | b'(' | b'[' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(ServerError::new(
                        format!(
                            "Query is nested too deep: at most {MAX_NESTING} levels of braces, parentheses and brackets."
                        ),
                        None,
                    ));
                }
            }
            b'}' | b')' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Refuses an argument holding a string with a NUL character (the variables in it are
/// checked on their own, so they stand for `null` here).
macro_rules! check_arguments {
    ($arguments:expr) => {
        for (name, value) in $arguments {
            let value = match value
                .node
                .clone()
                .into_const_with(|_| Ok::<_, std::convert::Infallible>(Value::Null))
            {
                Ok(value) => value,
                Err(never) => match never {},
            };
            if has_nul(&value) {
                return Err(nul(name.node.as_str(), Some(name.pos)));
            }
        }
    };
}

/// What a selection set costs with its fragments expanded.
#[derive(Clone, Copy, Default)]
struct Cost {
    /// Fields selected, counting each spread of a fragment in full.
    selections: usize,
    /// Nesting, counting fragment spreads and inline fragments as levels too (the validator
    /// and the executor recurse through them).
    depth: usize,
    /// Fields selected at this level, through fragments.
    roots: usize,
    /// Introspection fields (`__schema`, `__type`) at this level, through fragments.
    introspection: usize,
}

struct Measure<'a> {
    document: &'a ExecutableDocument,
    /// Each fragment's cost once known; `None` while it is being measured (a cycle).
    fragments: HashMap<&'a str, Option<Cost>>,
}

impl<'a> Measure<'a> {
    fn selection_set(&mut self, set: &'a SelectionSet, depth: usize) -> ServerResult<Cost> {
        if depth > MAX_NESTING {
            return Err(too_complex(format_args!(
                "nested deeper than {MAX_NESTING} levels with its fragments expanded"
            )));
        }
        let mut total = Cost::default();
        for item in &set.items {
            let inner = match &item.node {
                Selection::Field(field) => {
                    if field.node.directives.len() > MAX_DIRECTIVES {
                        return Err(ServerError::new(
                            format!(
                                "The field `{}` has more than {MAX_DIRECTIVES} directives.",
                                field.node.name.node
                            ),
                            Some(field.pos),
                        ));
                    }
                    check_arguments!(&field.node.arguments);
                    for directive in &field.node.directives {
                        check_arguments!(&directive.node.arguments);
                    }
                    let inner = self.selection_set(&field.node.selection_set.node, depth + 1)?;
                    let name = field.node.name.node.as_str();
                    Cost {
                        selections: inner.selections.saturating_add(1),
                        depth: inner.depth,
                        roots: 1,
                        introspection: usize::from(name == "__schema" || name == "__type"),
                    }
                }
                Selection::InlineFragment(inline) => {
                    for directive in &inline.node.directives {
                        check_arguments!(&directive.node.arguments);
                    }
                    self.selection_set(&inline.node.selection_set.node, depth + 1)?
                }
                Selection::FragmentSpread(spread) => {
                    for directive in &spread.node.directives {
                        check_arguments!(&directive.node.arguments);
                    }
                    self.fragment(spread.node.fragment_name.node.as_str(), depth)?
                }
            };
            total.selections = total.selections.saturating_add(inner.selections);
            total.depth = total.depth.max(inner.depth);
            total.roots = total.roots.saturating_add(inner.roots);
            total.introspection = total.introspection.saturating_add(inner.introspection);
            if total.selections > MAX_SELECTIONS {
                return Err(too_complex(format_args!(
                    "more than {MAX_SELECTIONS} fields with its fragments expanded"
                )));
            }
        }
        total.depth += 1;
        Ok(total)
    }

    /// A fragment's cost, measured once however often it is spread.
    fn fragment(&mut self, name: &'a str, depth: usize) -> ServerResult<Cost> {
        let cost = match self.fragments.get(name) {
            Some(Some(cost)) => *cost,
            Some(None) => {
                return Err(ServerError::new(
                    format!("Cannot spread fragment \"{name}\" within itself."),
                    None,
                ));
            }
            None => {
                // An unknown fragment is the validator's to report.
                let Some(fragment) = self.document.fragments.get(name) else {
                    return Ok(Cost::default());
                };
                self.fragments.insert(name, None);
                let cost = self.selection_set(&fragment.node.selection_set.node, 1)?;
                self.fragments.insert(name, Some(cost));
                cost
            }
        };
        if depth + cost.depth > MAX_NESTING {
            return Err(too_complex(format_args!(
                "nested deeper than {MAX_NESTING} levels with its fragments expanded"
            )));
        }
        Ok(Cost {
            depth: cost.depth + 1,
            ..cost
        })
    }
}

/// Measures `document` with its fragments expanded, each fragment once: each operation may
/// select at most [`MAX_SELECTIONS`] fields and [`MAX_ROOT_FIELDS`] at its root, and nest
/// at most [`MAX_NESTING`] levels through its fragments; a field carries at most
/// [`MAX_DIRECTIVES`] directives; a document defines at most [`MAX_FRAGMENTS`] fragments.
fn measure(document: &ExecutableDocument) -> ServerResult<()> {
    if document.fragments.len() > MAX_FRAGMENTS {
        return Err(too_complex(format_args!(
            "more than {MAX_FRAGMENTS} fragments"
        )));
    }
    let mut measure = Measure {
        document,
        fragments: HashMap::new(),
    };
    for (_, operation) in document.operations.iter() {
        for variable in &operation.node.variable_definitions {
            if let Some(default) = &variable.node.default_value
                && has_nul(&default.node)
            {
                return Err(nul(variable.node.name.node.as_str(), Some(default.pos)));
            }
        }
        for directive in &operation.node.directives {
            check_arguments!(&directive.node.arguments);
        }
        let cost = measure.selection_set(&operation.node.selection_set.node, 0)?;
        if cost.roots > MAX_ROOT_FIELDS {
            return Err(too_complex(format_args!(
                "more than {MAX_ROOT_FIELDS} fields at its root"
            )));
        }
        // An introspection field returns the whole schema however little it selects.
        if cost.introspection > MAX_INTROSPECTION_FIELDS {
            return Err(too_complex(format_args!(
                "more than {MAX_INTROSPECTION_FIELDS} introspection fields (__schema, __type)"
            )));
        }
    }
    // Fragments no operation spreads are validated too.
    for name in document.fragments.keys() {
        if !measure.fragments.contains_key(name.as_str()) {
            measure.fragment(name.as_str(), 0)?;
        }
    }
    Ok(())
}

fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::List(items) => items.iter().any(has_nul),
        Value::Object(fields) => fields.values().any(has_nul),
        _ => false,
    }
}
