//! Human-readable tables of API answers.

use chrono::{DateTime, SecondsFormat, Utc};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde_json::Value;

use crate::policy::DEFAULT_DEADLINE_MS;

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

/// Drops `null` members (at every depth) so optional flags that were not given are not sent.
pub fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            (map.into_iter())
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
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
    let rows = value["items"].as_array().into_iter().flatten().map(|k| {
        ["id", "name", "role", "agent", "createdAt", "revokedAt"]
            .iter()
            .map(|f| cell(&k[*f]))
            .collect()
    });
    let out = table(&["id", "name", "role", "agent", "created", "revoked"], rows);
    more(out, value, "--cursor")
}

pub fn nodes(value: &Value) -> String {
    let rows = value["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(node_row);
    let out = table(
        &[
            "node",
            "org",
            "region",
            "units",
            "topologyGen",
            "singleClass",
        ],
        rows,
    );
    more(out, value, "--cursor")
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
    let out = table(
        &["id", "at", "actor", "org", "action", "object", "reason"],
        rows,
    );
    more(out, value, "--cursor")
}

/// `out` and, while the list goes on, the flag that shows its next page.
fn more(mut out: String, value: &Value, flag: &str) -> String {
    if let Some(cursor) = value["cursor"].as_str() {
        out.push_str(&format!("\nmore: {flag} {cursor}"));
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
    let out = table(
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
    );
    more(out, value, "--cursor")
}

/// Epoch milliseconds as RFC 3339 in UTC (fractions only when there are some).
pub fn instant(value: &Value) -> String {
    value
        .as_i64()
        .and_then(DateTime::<Utc>::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
        .unwrap_or_else(|| cell(value))
}

const POOL_HEADER: [&str; 8] = [
    "id", "name", "owner", "nodes", "placer", "sharing", "options", "archived",
];

fn pool_row(p: &Value) -> Vec<String> {
    let policy = &p["policy"];
    let mut options: Vec<String> = ["tenantRoot", "kubernetes", "budgetCheck"]
        .into_iter()
        .filter(|flag| policy[*flag] == Value::Bool(true))
        .map(str::to_string)
        .collect();
    if let Some(per_gpu) = policy.get("perGpu") {
        options.push(format!(
            "perGpu {} vCPU, {} GiB",
            cell(&per_gpu["vcpu"]),
            cell(&per_gpu["memoryGiB"])
        ));
    }
    vec![
        cell(&p["id"]),
        cell(&p["name"]),
        cell(&p["ownerOrgId"]),
        cell(&p["nodeIds"]),
        cell(&policy["placer"]),
        cell(&policy["sharing"]),
        options.join(", "),
        cell(&p["archived"]),
    ]
}

pub fn pools(value: &Value) -> String {
    let rows = value["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(pool_row);
    more(table(&POOL_HEADER, rows), value, "--cursor")
}

pub fn pool(value: &Value) -> String {
    table(&POOL_HEADER, [pool_row(value)])
}

/// Each quota resource as `used/limit`; a resource used without a row has a limit of 0.
fn quota_use(offer: &Value) -> String {
    let mut resources: Vec<&String> = offer["quota"]
        .as_object()
        .into_iter()
        .flat_map(|q| q.keys())
        .chain(offer["used"].as_object().into_iter().flat_map(|u| u.keys()))
        .collect();
    resources.sort();
    resources.dedup();
    resources
        .into_iter()
        .map(|r| {
            let used = offer["used"][r].as_i64().unwrap_or(0);
            let limit = offer["quota"][r].as_i64().unwrap_or(0);
            format!("{r} {used}/{limit}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const OFFER_HEADER: [&str; 6] = [
    "pool",
    "tenant",
    "used/quota",
    "price per GPU-hour",
    "budget",
    "updated",
];

fn offer_row(o: &Value) -> Vec<String> {
    vec![
        cell(&o["poolId"]),
        cell(&o["tenantId"]),
        quota_use(o),
        cell(&o["pricePerGpuHour"]),
        cell(&o["budget"]),
        cell(&o["updatedAt"]),
    ]
}

pub fn offers(value: &Value) -> String {
    let rows = value["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(offer_row);
    more(table(&OFFER_HEADER, rows), value, "--cursor")
}

pub fn offer(value: &Value) -> String {
    table(&OFFER_HEADER, [offer_row(value)])
}

const COMPUTE_HEADER: [&str; 8] = [
    "id",
    "state",
    "pool",
    "node",
    "units",
    "start",
    "end",
    "conditions",
];

fn compute_row(r: &Value) -> Vec<String> {
    let conditions = r["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| format!("{}/{}", cell(&c["type"]), cell(&c["reason"])))
        .collect::<Vec<_>>()
        .join("\n");
    vec![
        cell(&r["id"]),
        cell(&r["state"]),
        cell(&r["poolId"]),
        cell(&r["placement"]["nodeId"]),
        cell(&r["placement"]["unitIds"]),
        instant(&r["start"]),
        instant(&r["end"]),
        conditions,
    ]
}

/// A compute reservation: its row, why it ended, and its conditions with their messages.
pub fn reservation(value: &Value) -> String {
    let mut out = table(&COMPUTE_HEADER, [compute_row(value)]);
    if let Some(reason) = value["reason"].as_str() {
        out.push_str(&format!("\nreason: {reason}"));
    }
    if let Some(deadline) = value.get("leaseDeadline") {
        out.push_str(&format!("\nlease deadline: {}", instant(deadline)));
    }
    let conditions: Vec<Vec<String>> = value["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            vec![
                cell(&c["type"]),
                cell(&c["reason"]),
                cell(&c["message"]),
                instant(&c["since"]),
            ]
        })
        .collect();
    if !conditions.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &["condition", "reason", "message", "since"],
            conditions,
        ));
    }
    out
}

/// A page of compute reservations.
pub fn reservations(value: &Value) -> String {
    let rows = value["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(compute_row);
    more(table(&COMPUTE_HEADER, rows), value, "--cursor")
}

/// The answer of `extend`: the reservation, and whether its end moved.
pub fn extended(value: &Value) -> String {
    let mut out = reservation(&value["reservation"]);
    if value["extended"] == Value::Bool(true) {
        out.push_str("\nextended");
    } else if let Some(until) = value.get("availableUntil") {
        out.push_str(&format!(
            "\nnot extended: a later booking blocks; the end can reach {}",
            instant(until)
        ));
    } else {
        out.push_str("\nnot extended: the reservation already ends then or later");
    }
    out
}

/// A quota check's charges: "8 gpu (used 5 of 8), …".
fn quota_charges(quota: &Value) -> String {
    let charges: Vec<String> = (quota["resources"].as_array().into_iter().flatten())
        .map(|l| {
            format!(
                "{} {} (used {} of {})",
                cell(&l["requested"]),
                cell(&l["resource"]),
                cell(&l["used"]),
                cell(&l["limit"])
            )
        })
        .collect();
    charges.join(", ")
}

/// A budget check's figures, and why it refuses.
fn budget_figures(budget: &Value) -> String {
    let why = budget["reason"]
        .as_str()
        .map_or_else(String::new, |r| format!(" ({r})"));
    format!(
        "charge {}, limit {}, spent {}, committed {}{why}",
        cell(&budget["chargeMinor"]),
        cell(&budget["limitMinor"]),
        cell(&budget["spentMinor"]),
        cell(&budget["committedMinor"]),
    )
}

/// The answer of `availability`: one row per slot and member, then quota and budget.
pub fn availability(value: &Value) -> String {
    let rows = value["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|slot| {
            slot["members"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |m| {
                    vec![
                        instant(&slot["start"]),
                        instant(&slot["latestStart"]),
                        instant(&slot["end"]),
                        cell(&m["nodeId"]),
                        cell(&m["unitIds"]),
                    ]
                })
        });
    let mut out = table(&["start", "latest start", "end", "node", "units"], rows);
    out.push_str(&format!(
        "\nsearched until {}",
        instant(&value["searchedUntil"])
    ));
    let admits = |check: &Value| match check["admits"].as_bool() {
        Some(true) => "admits",
        _ => "refuses",
    };
    let quota = &value["quota"];
    out.push_str(&format!(
        "\nquota {}: {}",
        admits(quota),
        quota_charges(quota)
    ));
    if let Some(budget) = value.get("budget") {
        out.push_str(&format!(
            "\nbudget {}: {}",
            admits(budget),
            budget_figures(budget)
        ));
    }
    out
}

/// The answer of `plan`: what create would answer, then each step.
pub fn plan(value: &Value) -> String {
    let mut rows = vec![
        vec!["reservation".to_string(), cell(&value["reservationId"])],
        vec!["outcome".to_string(), cell(&value["outcome"])],
    ];
    let mut step = |name: &str, text: String| {
        if !text.is_empty() {
            rows.push(vec![name.to_string(), text]);
        }
    };
    step("replayed", cell(&value["replayed"]));
    step("iam", cell(&value["iam"]));
    step("quota", quota_charges(&value["quota"]));
    if let Some(budget) = value.get("budget") {
        step("budget", budget_figures(budget));
    }
    let placement = &value["placement"];
    step("placement", cell(&placement["state"]));
    for member in placement["members"].as_array().into_iter().flatten() {
        step(
            "units",
            format!("{}: {}", cell(&member["nodeId"]), cell(&member["unitIds"])),
        );
    }
    step("placed by", cell(&placement["placedBy"]));
    step("preempts", cell(&placement["preempts"]));
    step("preempted by", cell(&placement["preemptedBy"]));
    step("waits because", cell(&placement["reason"]));
    table(&["step", "answer"], rows)
}

/// An org's policy as the Cedar text it was set with, unchanged, so that it can be edited
/// and set again as often as needed; nothing when the org has none.
pub fn policy(value: &Value) -> String {
    value["policy"].as_str().unwrap_or_default().to_string()
}

const CONFIRMATION_HEADER: [&str; 8] = [
    "id",
    "state",
    "reservation",
    "requested by",
    "action",
    "attributes",
    "decided by",
    "expires",
];

fn confirmation_row(c: &Value) -> Vec<String> {
    let attributes = c["attributes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| !matches!(v, Value::String(s) if s.is_empty()))
        .map(|(k, v)| format!("{k}={}", cell(v)))
        .collect::<Vec<_>>()
        .join("\n");
    vec![
        cell(&c["id"]),
        cell(&c["state"]),
        cell(&c["reservationId"]),
        cell(&c["requestedBy"]),
        cell(&c["action"]),
        attributes,
        cell(&c["decidedBy"]),
        cell(&c["expiresAt"]),
    ]
}

pub fn confirmations(value: &Value) -> String {
    let rows = value["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(confirmation_row);
    more(table(&CONFIRMATION_HEADER, rows), value, "--cursor")
}

pub fn confirmation(value: &Value) -> String {
    table(&CONFIRMATION_HEADER, [confirmation_row(value)])
}

/// A page of events: what changed, with the reservation's state when the event carries one.
pub fn events(value: &Value) -> String {
    let rows = value["items"].as_array().into_iter().flatten().map(|e| {
        let payload = &e["payload"];
        let mut detail: Vec<String> = payload["reservation"]
            .get("state")
            .map(|s| format!("state={}", cell(s)))
            .into_iter()
            .collect();
        detail.extend(
            payload
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| *k != "reservation")
                .map(|(k, v)| match k.as_str() {
                    "start" | "end" => format!("{k}={}", instant(v)),
                    _ => format!("{k}={}", cell(v)),
                }),
        );
        vec![
            cell(&e["id"]),
            cell(&e["at"]),
            cell(&e["type"]),
            cell(&e["objectId"]),
            detail.join(" "),
        ]
    });
    more(
        table(&["id", "at", "type", "object", "detail"], rows),
        value,
        "--after",
    )
}

const PLUGIN_HEADER: [&str; 8] = [
    "id",
    "name",
    "version",
    "world",
    "built in",
    "bytes",
    "created",
    "assigned to",
];

fn plugin_row(p: &Value) -> Vec<String> {
    [
        "id",
        "name",
        "version",
        "world",
        "builtIn",
        "size",
        "createdAt",
        "assignedTo",
    ]
    .iter()
    .map(|f| match (*f, &p[*f]) {
        ("builtIn", Value::Bool(true)) => "yes".to_string(),
        ("builtIn", _) => "no".to_string(),
        (_, value) => cell(value),
    })
    .collect()
}

pub fn plugins(value: &Value) -> String {
    let rows = value["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(plugin_row);
    more(table(&PLUGIN_HEADER, rows), value, "--cursor")
}

pub fn plugin(value: &Value) -> String {
    table(&PLUGIN_HEADER, [plugin_row(value)])
}

/// A plugin's log lines, newest first.
pub fn plugin_logs(value: &Value) -> String {
    let rows = value["items"].as_array().into_iter().flatten().map(|l| {
        ["id", "at", "level", "replica", "message"]
            .iter()
            .map(|f| cell(&l[*f]))
            .collect()
    });
    let out = table(&["id", "at", "level", "replica", "message"], rows);
    more(out, value, "--cursor")
}

/// A pool's policies, one row per setting: each policy's plugin, the one assigned or the
/// built-in default that decides when none is.
pub fn policies(value: &Value) -> String {
    let plugin = |field: &str| {
        let decider = &value["effective"][field];
        let name = cell(&decider["name"]);
        match value.get(field) {
            Some(id) if name.is_empty() => cell(id),
            Some(id) => format!("{name} {}", cell(id)),
            None if name.is_empty() => "default (built in)".to_string(),
            None => format!("default (built in): {name}"),
        }
    };
    let rows = vec![
        vec!["placement".to_string(), plugin("placement")],
        vec!["preemption".to_string(), plugin("preemption")],
        vec!["spend guard".to_string(), plugin("spendLimit")],
        vec![
            "config".to_string(),
            value
                .get("config")
                .map_or_else(String::new, Value::to_string),
        ],
        vec![
            "deadline ms".to_string(),
            value
                .get("deadlineMs")
                .map_or_else(|| format!("{DEFAULT_DEADLINE_MS} (default)"), cell),
        ],
        vec![
            "on policy failure".to_string(),
            cell(&value["onPolicyFailure"]),
        ],
        vec!["updated".to_string(), cell(&value["updatedAt"])],
    ];
    table(&["setting", "value"], rows)
}

/// `GET /v1/status`: the answering replica, then one table of replicas and one of plugins.
pub fn status(value: &Value) -> String {
    let when = |v: &Value| v.as_i64().map(crate::clock::format_ms).unwrap_or_default();
    let reconciler = &value["reconciler"];
    let mut out = format!(
        "orl {} on {}, answered by {}\nreconciler: last pass {}, {} due, lag {} s\n",
        cell(&value["version"]),
        cell(&value["database"]),
        cell(&value["replica"]),
        match when(&reconciler["lastPassAt"]) {
            w if w.is_empty() => "none yet".to_string(),
            w => w,
        },
        cell(&reconciler["due"]),
        cell(&reconciler["lagSeconds"]),
    );
    let replicas = value["replicas"].as_array().cloned().unwrap_or_default();
    out += &table(
        &["replica", "version", "host", "started", "seen"],
        replicas.iter().map(|r| {
            vec![
                cell(&r["id"]),
                cell(&r["version"]),
                cell(&r["host"]),
                when(&r["startedAt"]),
                when(&r["seenAt"]),
            ]
        }),
    );
    let plugins = value["plugins"].as_array().cloned().unwrap_or_default();
    if plugins.is_empty() {
        out += "\nno policy decisions on this replica yet";
    } else {
        out += "\n";
        out += &table(
            &["plugin", "world", "decisions", "failures"],
            plugins.iter().map(|p| {
                vec![
                    cell(&p["pluginId"]),
                    cell(&p["world"]),
                    cell(&p["decisions"]),
                    cell(&p["failures"]),
                ]
            }),
        );
    }
    out
}
