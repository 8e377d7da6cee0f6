//! A pool's sellable units by model, counted by what holds them ([`UnitState`]): now, at
//! steps over the coming week (from the bookings and node reservation terms the capacity
//! view holds, so a forecast is what is booked and reserved so far), and how much of them
//! bookings held in each hour of the last day.

use std::collections::HashMap;

use sqlx::Row as _;

use crate::capacity::{Nodes, UnitState};
use crate::iam::Principal;
use crate::pools::store;
use crate::{App, Result};

/// How far ahead the forecast looks.
pub const AHEAD_MS: i64 = 7 * 24 * HOUR_MS;
/// The step between forecast points.
pub const STEP_MS: i64 = 6 * HOUR_MS;
/// How far back utilization looks, in hours.
pub const HOURS_BACK: i64 = 24;
const HOUR_MS: i64 = 3_600_000;

/// One pool's units by model.
pub struct PoolCounts {
    pub pool_id: String,
    pub pool_name: String,
    pub models: Vec<ModelCounts>,
}

/// The sellable units of one model in one pool.
pub struct ModelCounts {
    pub model: String,
    /// At `now`.
    pub now: Tally,
    /// At `now`, then every [`STEP_MS`] up to [`AHEAD_MS`] ahead: `(instant, tally)`.
    pub ahead: Vec<(i64, Tally)>,
    /// Each of the last [`HOURS_BACK`] hours, oldest first: `(hour start, booked share 0-1)`.
    pub hourly: Vec<(i64, f64)>,
    /// Booked unit time over unit time in the last [`HOURS_BACK`] hours, 0-1.
    pub utilization: f64,
}

/// Units by what holds them; each unit counts in exactly one state.
#[derive(Clone, Copy, Default)]
pub struct Tally {
    pub lost: i64,
    pub booked: i64,
    pub reserved: i64,
    pub released: i64,
    pub free: i64,
}

impl Tally {
    pub fn total(&self) -> i64 {
        self.lost + self.booked + self.reserved + self.released + self.free
    }

    fn add(&mut self, state: UnitState) {
        match state {
            UnitState::Lost => self.lost += 1,
            UnitState::Booked => self.booked += 1,
            UnitState::Reserved => self.reserved += 1,
            UnitState::Released => self.released += 1,
            UnitState::Free => self.free += 1,
        }
    }
}

/// The counts of every pool the caller sees (or only `pool_id`, not found when unseen).
pub async fn pools(
    app: &App,
    caller: &Principal,
    pool_id: Option<&str>,
) -> Result<Vec<PoolCounts>> {
    let pools = match pool_id {
        Some(id) => vec![store::get(app, caller, id).await?],
        None => store::every(app, caller).await?,
    };
    let now = app.now_ms();
    let mut counted = Vec::with_capacity(pools.len());
    for pool in pools {
        let list = app.capacity.pool(&pool.id).await?;
        let booked = booked_by_hour(app, &pool.id, &list.nodes, now).await?;
        counted.push(PoolCounts {
            models: count(&list.nodes, now, &booked),
            pool_id: pool.id,
            pool_name: pool.name,
        });
    }
    Ok(counted)
}

/// The counts of `nodes` by model; `booked` is unit-ms booked per model and hour.
fn count(nodes: &Nodes, now: i64, booked: &HashMap<String, Vec<i64>>) -> Vec<ModelCounts> {
    let instants: Vec<i64> = (0..=AHEAD_MS / STEP_MS)
        .map(|k| now + k * STEP_MS)
        .collect();
    let mut by_model: HashMap<String, Vec<Tally>> = HashMap::new();
    let mut scratch = Vec::new();
    for node in nodes {
        let models = node.models();
        for (i, at) in instants.iter().enumerate() {
            node.unit_states(*at, &mut scratch, |slot, state| {
                let model = &models[slot.model as usize];
                if !by_model.contains_key(model) {
                    by_model.insert(model.clone(), vec![Tally::default(); instants.len()]);
                }
                by_model.get_mut(model).expect("inserted above")[i].add(state);
            });
        }
    }
    let mut counted: Vec<ModelCounts> = by_model
        .into_iter()
        .map(|(model, tallies)| {
            let units = tallies[0].total();
            let hours = booked.get(&model);
            let hourly: Vec<(i64, f64)> = (0..HOURS_BACK)
                .map(|h| {
                    let start = now - (HOURS_BACK - h) * HOUR_MS;
                    let held = hours.map_or(0, |b| b[h as usize]);
                    (start, share(held, units * HOUR_MS))
                })
                .collect();
            let held: i64 = hours.map_or(0, |b| b.iter().sum());
            ModelCounts {
                utilization: share(held, units * HOURS_BACK * HOUR_MS),
                now: tallies[0],
                ahead: instants.iter().copied().zip(tallies).collect(),
                hourly,
                model,
            }
        })
        .collect();
    counted.sort_by(|a, b| a.model.cmp(&b.model));
    counted
}

fn share(part: i64, whole: i64) -> f64 {
    if whole <= 0 {
        0.0
    } else {
        (part as f64 / whole as f64).clamp(0.0, 1.0)
    }
}

/// Unit-ms that bookings held of the pool's sellable units in each of the last
/// [`HOURS_BACK`] hours, by model: released bookings count up to where they were released.
async fn booked_by_hour(
    app: &App,
    pool_id: &str,
    nodes: &Nodes,
    now: i64,
) -> Result<HashMap<String, Vec<i64>>> {
    let from = now - HOURS_BACK * HOUR_MS;
    let rows = sqlx::query(
        "SELECT b.node_id, b.unit_id, b.start_ms, b.end_ms
         FROM bookings b JOIN pool_nodes p ON p.node_id = b.node_id
         WHERE p.pool_id = $1 AND b.end_ms > $2 AND b.start_ms < $3 AND b.end_ms > b.start_ms",
    )
    .bind(pool_id)
    .bind(from)
    .bind(now)
    .fetch_all(app.store.pool())
    .await?;
    let model_of: HashMap<(&str, &str), &str> = nodes
        .iter()
        .flat_map(|n| {
            n.node
                .units
                .iter()
                .filter(|u| u.sellable)
                .map(move |u| ((n.node.id.as_str(), u.id.as_str()), u.model.as_str()))
        })
        .collect();
    let mut booked: HashMap<String, Vec<i64>> = HashMap::new();
    for r in &rows {
        let node: String = r.try_get("node_id")?;
        let unit: String = r.try_get("unit_id")?;
        let Some(model) = model_of.get(&(node.as_str(), unit.as_str())) else {
            continue;
        };
        let (start, end): (i64, i64) = (r.try_get("start_ms")?, r.try_get("end_ms")?);
        let hours = booked
            .entry(model.to_string())
            .or_insert_with(|| vec![0; HOURS_BACK as usize]);
        for (h, held) in hours.iter_mut().enumerate() {
            let hour_start = from + h as i64 * HOUR_MS;
            let hour_end = hour_start + HOUR_MS;
            *held += (end.min(hour_end) - start.max(hour_start)).max(0);
        }
    }
    Ok(booked)
}
