//! Human-readable tables of API answers.

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde_json::Value;

fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    table.to_string()
}

/// A cell: strings bare, arrays comma-joined, absent as empty.
pub fn cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(cell).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Drops `null` members so optional flags that were not given are not sent.
pub fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            Value::Object(map.into_iter().filter(|(_, v)| !v.is_null()).collect())
        }
        other => other,
    }
}

/// Any object as field/value rows.
pub fn object(value: &Value) -> String {
    let Some(map) = value.as_object() else {
        return cell(value);
    };
    table(
        &["field", "value"],
        map.iter().map(|(k, v)| vec![k.clone(), cell(v)]),
    )
}

pub fn keys(value: &Value) -> String {
    let rows = value.as_array().into_iter().flatten().map(|k| {
        ["id", "name", "role", "agent", "createdAt", "revokedAt"]
            .iter()
            .map(|f| cell(&k[*f]))
            .collect()
    });
    table(&["id", "name", "role", "agent", "created", "revoked"], rows)
}

pub fn nodes(value: &Value) -> String {
    let rows = value.as_array().into_iter().flatten().map(node_row);
    table(
        &[
            "node",
            "org",
            "region",
            "units",
            "topologyGen",
            "singleClass",
        ],
        rows,
    )
}

pub fn node(value: &Value) -> String {
    let summary = table(
        &[
            "node",
            "org",
            "region",
            "units",
            "topologyGen",
            "singleClass",
        ],
        [node_row(value)],
    );
    let units = value["units"].as_array().into_iter().flatten().map(|u| {
        [
            "id",
            "class",
            "deviceClass",
            "model",
            "memoryGiB",
            "nvlinkDomain",
            "sellable",
        ]
        .iter()
        .map(|f| cell(&u[*f]))
        .collect()
    });
    let units = table(
        &[
            "unit",
            "class",
            "deviceClass",
            "model",
            "memoryGiB",
            "nvlink",
            "sellable",
        ],
        units,
    );
    format!("{summary}\n{units}")
}

fn node_row(n: &Value) -> Vec<String> {
    vec![
        cell(&n["id"]),
        cell(&n["orgId"]),
        cell(&n["region"]),
        n["units"].as_array().map_or(0, Vec::len).to_string(),
        cell(&n["topologyGen"]),
        cell(&n["singleClass"]),
    ]
}

pub fn audit(value: &Value) -> String {
    let rows = value["items"].as_array().into_iter().flatten().map(|e| {
        [
            "id",
            "at",
            "actorKeyId",
            "orgId",
            "action",
            "objectId",
            "reason",
        ]
        .iter()
        .map(|f| cell(&e[*f]))
        .collect()
    });
    let mut out = table(
        &["id", "at", "actor", "org", "action", "object", "reason"],
        rows,
    );
    if let Some(cursor) = value["cursor"].as_str() {
        out.push_str(&format!("\nmore: --cursor {cursor}"));
    }
    out
}

const RESERVATION_FIELDS: [&str; 7] = [
    "id",
    "nodeId",
    "status",
    "reservedUnitIds",
    "releasedUnitIds",
    "allowedOrgIds",
    "endsAt",
];
const RESERVATION_HEADER: [&str; 7] = [
    "id", "node", "status", "reserved", "released", "audience", "ends",
];

pub fn node_reservations(value: &Value) -> String {
    let rows = value
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| RESERVATION_FIELDS.iter().map(|f| cell(&r[*f])).collect());
    table(&RESERVATION_HEADER, rows)
}

pub fn catalog(value: &Value) -> String {
    let rows = value["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| {
            n["units"].as_array().into_iter().flatten().map(move |u| {
                vec![
                    cell(&n["nodeId"]),
                    cell(&u["id"]),
                    cell(&u["model"]),
                    cell(&u["nvlinkDomain"]),
                    cell(&u["tier"]),
                    cell(&u["reservationId"]),
                    cell(&u["availableUntil"]),
                ]
            })
        });
    table(
        &[
            "node",
            "unit",
            "model",
            "nvlink",
            "tier",
            "reservation",
            "available until",
        ],
        rows,
    )
}
