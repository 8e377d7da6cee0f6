//! What the generated records offer beyond their fields: the class codes of the unit
//! columns, a node's runs of the columns, and a unit read back as one row.

use std::fmt;
use std::ops::Range;

use crate::types::{Candidates, DeviceClass, DeviceRequest, Request, Span};

/// `units.nvlink-domain` of a unit in no NVLink domain.
pub const NO_DOMAIN: u32 = u32::MAX;

/// One unit of a call, read from the columns of `candidates.units` by
/// [`Candidates::unit`]. Its id is its position in the columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// The unit's id in this call.
    pub id: u32,
    /// The device class it provides.
    pub class: DeviceClass,
    /// Its model, an index into `request.models`.
    pub model: u32,
    /// Its NVLink domain (unique within its node), or `None` outside any domain.
    pub nvlink_domain: Option<u32>,
    /// Its device memory in GiB; `0` when not applicable.
    pub memory_gib: u32,
}

impl DeviceClass {
    /// Every class, in the order of the WIT enum: `ALL[code]` is the class of `code`.
    pub const ALL: [DeviceClass; 6] = [
        DeviceClass::Gpu,
        DeviceClass::GpuMig,
        DeviceClass::GpuSlot,
        DeviceClass::NicVf,
        DeviceClass::Disk,
        DeviceClass::Node,
    ];

    /// The class as the `units.class` column carries it: the position of its case in the
    /// WIT enum.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The class of a `units.class` code, or `None` for a code no class has (a newer host
    /// may add classes; a policy should treat such a unit as matching nothing).
    pub fn from_code(code: u8) -> Option<DeviceClass> {
        DeviceClass::ALL.get(usize::from(code)).copied()
    }

    /// The WIT spelling (`gpu`, `gpu-mig`, …), for reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceClass::Gpu => "gpu",
            DeviceClass::GpuMig => "gpu-mig",
            DeviceClass::GpuSlot => "gpu-slot",
            DeviceClass::NicVf => "nic-vf",
            DeviceClass::Disk => "disk",
            DeviceClass::Node => "node",
        }
    }
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Span {
    /// The indices the span covers; saturates rather than overflow.
    pub fn range(self) -> Range<usize> {
        let start = self.start as usize;
        start..start.saturating_add(self.len as usize)
    }
}

impl Candidates {
    /// The ids of the units node `j` (a position in `nodes`, not an id) may take: its
    /// `free` run. Empty when there is no node `j` or the run reaches past the unit
    /// columns, so reading the units of the run never panics.
    pub fn free(&self, j: usize) -> Range<u32> {
        let (Some(&start), Some(&len)) = (self.nodes.free_start.get(j), self.nodes.free_len.get(j))
        else {
            return 0..0;
        };
        match start.checked_add(len) {
            Some(end) if end as usize <= self.units.class.len() => start..end,
            _ => 0..0,
        }
    }

    /// The entries of the `domains` columns that describe node `j`'s NVLink domains. Empty
    /// when there is no node `j` or the run reaches past the columns.
    pub fn domains_of(&self, j: usize) -> Range<usize> {
        let (Some(&start), Some(&len)) = (
            self.nodes.domains_start.get(j),
            self.nodes.domains_len.get(j),
        ) else {
            return 0..0;
        };
        let run = Span { start, len }.range();
        if run.end <= self.domains.domain.len() {
            run
        } else {
            0..0
        }
    }

    /// Busy units of `domain` on node `j`, as the host reported them; `0` when it did not.
    pub fn domain_busy(&self, j: usize, domain: u32) -> u32 {
        self.domains_of(j)
            .find(|&i| self.domains.domain[i] == domain)
            .and_then(|i| self.domains.busy.get(i).copied())
            .unwrap_or(0)
    }

    /// The string of `node-facts.text` that entry `i` of the columns `start` and `len`
    /// names, or `""` when there is no entry `i` or the run is not within the text or not
    /// on character boundaries.
    pub fn text(&self, start: &[u32], len: &[u32], i: usize) -> &str {
        run(start, len, i)
            .and_then(|run| self.node_facts.text.get(run))
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .unwrap_or("")
    }

    /// The name of node `j` (a position in `nodes`, not an id); `""` when there is no node
    /// `j`.
    pub fn node_name(&self, j: usize) -> &str {
        let facts = &self.node_facts;
        self.text(&facts.name_start, &facts.name_len, j)
    }

    /// The region of node `j`, or `None` when it has none (or there is no node `j`).
    pub fn node_region(&self, j: usize) -> Option<&str> {
        let facts = &self.node_facts;
        Some(self.text(&facts.region_start, &facts.region_len, j)).filter(|r| !r.is_empty())
    }

    /// The labels of node `j` as `(key, value)` pairs, sorted by key; none when there is
    /// no node `j` or its run reaches past the label columns.
    pub fn node_labels(&self, j: usize) -> impl Iterator<Item = (&str, &str)> {
        let f = &self.node_facts;
        let labels = f.key_start.len().min(f.key_len.len());
        let labels = labels.min(f.value_start.len()).min(f.value_len.len());
        let run = run(&f.labels_start, &f.labels_len, j).filter(|run| run.end <= labels);
        run.unwrap_or(0..0).map(|k| {
            let key = self.text(&f.key_start, &f.key_len, k);
            (key, self.text(&f.value_start, &f.value_len, k))
        })
    }

    /// The value of label `key` on node `j`, if it has that label.
    pub fn node_label(&self, j: usize, key: &str) -> Option<&str> {
        self.node_labels(j).find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Unit `id` as one row, or `None` when there is no such unit or its class code is
    /// unknown.
    pub fn unit(&self, id: u32) -> Option<Unit> {
        let i = id as usize;
        let units = &self.units;
        Some(Unit {
            id,
            class: DeviceClass::from_code(*units.class.get(i)?)?,
            model: *units.model.get(i)?,
            nvlink_domain: Some(*units.nvlink_domain.get(i)?).filter(|d| *d != NO_DOMAIN),
            memory_gib: *units.memory_gib.get(i)?,
        })
    }
}

/// Entry `i` of the columns `start` and `len` as a range, if there is one and it does not
/// overflow.
fn run(start: &[u32], len: &[u32], i: usize) -> Option<Range<usize>> {
    let (&start, &len) = (start.get(i)?, len.get(i)?);
    let start = start as usize;
    Some(start..start.checked_add(len as usize)?)
}

impl DeviceRequest {
    /// Whether `unit` may serve this entry: same class and, when the entry names a model,
    /// same model. NVLink domains are not considered here.
    pub fn accepts(&self, unit: &Unit) -> bool {
        unit.class == self.class && self.model.is_none_or(|m| m == unit.model)
    }
}

impl Request {
    /// How many units a placement of this request holds: the sum of the entries' counts.
    pub fn unit_count(&self) -> u64 {
        self.devices.iter().map(|d| u64::from(d.count)).sum()
    }

    /// The name of model index `model`, or `#<index>` when the request does not list it.
    pub fn model_name(&self, model: u32) -> String {
        match self.models.get(model as usize) {
            Some(name) => name.clone(),
            None => format!("#{model}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Domains, NodeFacts, Nodes, Units};

    /// Node 7 with units 0..2 free and domain 3 (one busy unit); node 8 with a run past the
    /// columns.
    fn candidates() -> Candidates {
        Candidates {
            nodes: Nodes {
                id: vec![7, 8],
                busy_units: vec![1, 0],
                total_units: vec![3, 4],
                domains_start: vec![0, 1],
                domains_len: vec![1, 5],
                free_start: vec![0, 2],
                free_len: vec![2, 9],
            },
            units: Units {
                class: vec![DeviceClass::Gpu.code(), 9, DeviceClass::NicVf.code()],
                model: vec![0, 0, 1],
                nvlink_domain: vec![3, 3, NO_DOMAIN],
                memory_gib: vec![80, 80, 0],
            },
            domains: Domains {
                domain: vec![3],
                busy: vec![1],
                total: vec![3],
            },
            // Node 7: `n7` in `eu`, labels rack=r1 and tier=a; node 8: `n8`, no region,
            // a label run past the columns.
            node_facts: NodeFacts {
                text: b"n7eurackr1tieran8".to_vec(),
                name_start: vec![0, 15],
                name_len: vec![2, 2],
                region_start: vec![2, 0],
                region_len: vec![2, 0],
                labels_start: vec![0, 1],
                labels_len: vec![2, 5],
                key_start: vec![4, 10],
                key_len: vec![4, 4],
                value_start: vec![8, 14],
                value_len: vec![2, 1],
            },
        }
    }

    #[test]
    fn class_codes_round_trip_in_the_order_of_the_wit_enum() {
        for (code, class) in DeviceClass::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(class.code()), code);
            assert_eq!(DeviceClass::from_code(class.code()), Some(class));
        }
        assert_eq!(DeviceClass::from_code(6), None);
        assert_eq!(DeviceClass::GpuMig.to_string(), "gpu-mig");
    }

    #[test]
    fn runs_past_the_columns_are_empty() {
        let c = candidates();

        assert_eq!(c.free(0), 0..2);
        assert_eq!(c.free(1), 0..0);
        assert_eq!(c.free(2), 0..0);
        assert_eq!(c.domains_of(0), 0..1);
        assert_eq!(c.domains_of(1), 0..0);
        assert_eq!((c.domain_busy(0, 3), c.domain_busy(0, 4)), (1, 0));
    }

    #[test]
    fn node_facts_read_as_strings_and_runs_past_the_text_read_as_empty() {
        let mut c = candidates();

        assert_eq!(
            (c.node_name(0), c.node_name(1), c.node_name(2)),
            ("n7", "n8", "")
        );
        assert_eq!((c.node_region(0), c.node_region(1)), (Some("eu"), None));
        let labels: Vec<_> = c.node_labels(0).collect();
        assert_eq!(labels, [("rack", "r1"), ("tier", "a")]);
        assert_eq!(c.node_label(0, "tier"), Some("a"));
        assert_eq!(c.node_labels(1).count(), 0, "a run past the label columns");
        c.node_facts.name_len[1] = 5;
        assert_eq!(c.node_name(1), "", "a run past the text");
        c.node_facts.text[0] = 0xff;
        assert_eq!(c.node_name(0), "", "not UTF-8");
    }

    #[test]
    fn a_unit_reads_back_as_a_row_unless_its_class_is_unknown() {
        let c = candidates();
        let gpu = c.unit(0).unwrap();
        let entry = DeviceRequest {
            class: DeviceClass::Gpu,
            count: 1,
            model: Some(0),
            nvlink_all: false,
        };

        assert_eq!(
            (gpu.id, gpu.class, gpu.nvlink_domain),
            (0, DeviceClass::Gpu, Some(3))
        );
        assert!(entry.accepts(&gpu));
        assert_eq!(c.unit(1), None, "class code 9 is no class");
        assert_eq!(c.unit(2).unwrap().nvlink_domain, None);
        assert!(!entry.accepts(&c.unit(2).unwrap()));
        assert_eq!(c.unit(3), None);
    }
}
