use serde_json::{Value, json};

use super::*;

fn request(patch: Value) -> Result<CreateRequest, String> {
    let mut base = json!({
        "tenantId": "tenant-a",
        "poolId": "pool_01jd0000000000000000000000",
        "devices": [{ "class": "gpu", "count": 2 }],
        "duration": "2h",
        "idempotencyKey": "k-1",
    });
    for (k, v) in patch.as_object().unwrap() {
        if v.is_null() {
            base.as_object_mut().unwrap().remove(k);
        } else {
            base[k] = v.clone();
        }
    }
    // The HTTP layer reports serde errors with their path, as here.
    let parsed: CreateRequest =
        serde_path_to_error::deserialize(base).map_err(|e| e.to_string())?;
    parsed.validate().map_err(|e| e.to_string())?;
    Ok(parsed)
}

/// Each row: a change to a valid request, and the field its refusal must name (or "" when
/// it must be accepted).
#[test]
fn every_input_constraint_of_create_is_enforced() {
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), ""),
        (json!({ "tenantId": "a".repeat(128) }), ""),
        (json!({ "tenantId": "a".repeat(129) }), "tenantId"),
        (json!({ "tenantId": "bad tenant" }), "tenantId"),
        (json!({ "tenantId": null }), "tenantId"),
        (
            json!({ "poolId": "pool_01JD0000000000000000000000" }),
            "poolId",
        ),
        (
            json!({ "poolId": "pool_01jd000000000000000000000" }),
            "poolId",
        ),
        (json!({ "poolId": format!("pool_{}", "0".repeat(52)) }), ""),
        (
            json!({ "poolId": format!("pool_{}", "0".repeat(53)) }),
            "poolId",
        ),
        (
            json!({ "poolId": "pool_01jd00000000000000000000u0" }),
            "poolId",
        ),
        (json!({ "projectId": "prj_01jd0000000000000000000000" }), ""),
        (json!({ "projectId": "project-1" }), "projectId"),
        (json!({ "devices": [] }), "devices"),
        (
            json!({ "devices": vec![json!({ "class": "gpu", "count": 1 }); 8] }),
            "",
        ),
        (
            json!({ "devices": vec![json!({ "class": "gpu", "count": 1 }); 9] }),
            "devices",
        ),
        (
            json!({ "devices": [{ "class": "tpu", "count": 1 }] }),
            "class",
        ),
        (
            json!({ "devices": [{ "class": "gpu.mig", "count": 64 }] }),
            "",
        ),
        (
            json!({ "devices": [{ "class": "gpu", "count": 0 }] }),
            "devices[0].count",
        ),
        (
            json!({ "devices": [{ "class": "gpu", "count": 65 }] }),
            "devices[0].count",
        ),
        (
            json!({ "devices": [{ "class": "gpu", "count": 1, "topology": "ring" }] }),
            "topology",
        ),
        (
            json!({ "devices": [{ "class": "gpu", "count": 1, "sharing": "mps" }] }),
            "",
        ),
        (
            json!({ "devices": [{ "class": "gpu", "count": 1, "sharing": "fair" }] }),
            "sharing",
        ),
        (
            json!({ "devices": [{ "class": "gpu", "count": 1, "selector": { "model": "H100-SXM5-80GB" } }] }),
            "",
        ),
        (json!({ "topology": "nvlink-all" }), ""),
        (json!({ "topology": "mesh" }), "topology"),
        (json!({ "start": 0 }), ""),
        (json!({ "start": MAX_INSTANT_MS }), ""),
        (json!({ "start": MAX_INSTANT_MS + 1 }), "start"),
        (json!({ "start": -1 }), "start"),
        (json!({ "duration": 3600 }), ""),
        (json!({ "duration": "1d 12h" }), ""),
        (json!({ "duration": 0 }), "duration"),
        (json!({ "duration": "soon" }), "duration"),
        (json!({ "duration": null }), "duration"),
        (
            json!({ "resources": { "vcpu": 4096, "memoryGiB": 65536, "hugepages1Gi": 4096 } }),
            "",
        ),
        (json!({ "resources": { "vcpu": 4097 } }), "resources.vcpu"),
        (
            json!({ "resources": { "memoryGiB": 65537 } }),
            "resources.memoryGiB",
        ),
        (
            json!({ "resources": { "hugepages1Gi": 4097 } }),
            "resources.hugepages1Gi",
        ),
        (json!({ "resources": { "gpus": 1 } }), "gpus"),
        (
            json!({ "node": { "profileId": "ubuntu/24.04:cuda-12" } }),
            "",
        ),
        (
            json!({ "node": { "profileId": "has space" } }),
            "node.profileId",
        ),
        (json!({ "node": { "profileVersion": 1 } }), "profileId"),
        (
            json!({ "node": { "profileId": "p", "profileVersion": 0 } }),
            "node.profileVersion",
        ),
        (json!({ "leaseSeconds": 30 }), ""),
        (json!({ "leaseSeconds": 29 }), "leaseSeconds"),
        (json!({ "leaseSeconds": 86401 }), "leaseSeconds"),
        (json!({ "spot": true }), ""),
        (json!({ "spot": "yes" }), "spot"),
        (json!({ "idempotencyKey": null }), "idempotencyKey"),
        (
            json!({ "idempotencyKey": "k".repeat(129) }),
            "idempotencyKey",
        ),
        (json!({ "idempotencyKey": "k/1" }), "idempotencyKey"),
        (json!({ "wait": { "timeoutMs": 30000 } }), ""),
        (json!({ "wait": { "timeoutMs": 30001 } }), "wait.timeoutMs"),
        (json!({ "wait": {} }), "timeoutMs"),
        (
            json!({ "gang": { "size": 2, "topologyKey": "region" } }),
            "",
        ),
        (json!({ "gang": { "size": 1 } }), "gang.size"),
        (json!({ "gang": { "size": 65 } }), "gang.size"),
        (
            json!({ "gang": { "size": 2, "topologyKey": "k".repeat(129) } }),
            "gang.topologyKey",
        ),
        (json!({ "binding": "node" }), ""),
        (json!({ "surprise": 1 }), "surprise"),
    ];
    for (patch, field) in cases {
        match (request(patch.clone()), field) {
            (Ok(_), "") => {}
            (Ok(_), field) => panic!("{patch} was accepted; expected a refusal naming {field}"),
            (Err(err), "") => panic!("{patch} was refused: {err}"),
            (Err(err), field) => {
                assert!(err.contains(field), "{patch}: {err:?} should name {field}")
            }
        }
    }
}

#[test]
fn only_three_bindings_are_supported() {
    assert_eq!(
        request(json!({})).unwrap().binding().unwrap(),
        Binding::Hold
    );
    assert_eq!(
        request(json!({ "binding": "kubernetes" }))
            .unwrap()
            .binding()
            .unwrap(),
        Binding::Kubernetes
    );
    let err = request(json!({ "binding": "vm" }))
        .unwrap()
        .binding()
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)));
}

#[test]
fn the_id_is_derived_from_tenant_caller_and_key() {
    let a = reservation_id("tenant-a", "key_1", "k-1");
    assert_eq!(a, reservation_id("tenant-a", "key_1", "k-1"));
    assert_ne!(a, reservation_id("tenant-a", "key_2", "k-1"));
    assert_ne!(a, reservation_id("tenant-b", "key_1", "k-1"));
    assert_ne!(a, reservation_id("tenant-a", "key_1", "k-2"));
    assert!(check_reservation_id("id", &a).is_ok(), "{a}");
}

#[test]
fn wait_is_not_part_of_the_compared_request() {
    let a = request(json!({ "wait": { "timeoutMs": 10 } })).unwrap();
    let b = request(json!({})).unwrap();
    assert_eq!(a.fingerprint(), b.fingerprint());
    let c = request(json!({ "duration": "3h" })).unwrap();
    assert_ne!(a.fingerprint(), c.fingerprint());
}

#[test]
fn the_per_gpu_share_is_a_floor_and_only_the_excess_is_charged() {
    let share = Some(PerGpu {
        vcpu: 16,
        memory_gib: 128,
    });
    let (booked, excess) = host_resources(2, share, None);
    assert_eq!((booked.vcpu, booked.memory_gib), (32, 256));
    assert_eq!(excess, HostBooking::default());
    let (booked, excess) = host_resources(
        2,
        share,
        Some(Resources {
            vcpu: 8,
            memory_gib: 0,
            hugepages_1gi: 0,
        }),
    );
    assert_eq!(booked.vcpu, 32, "asking below the share is raised to it");
    assert_eq!(excess.vcpu, 0);
    let (booked, excess) = host_resources(
        2,
        share,
        Some(Resources {
            vcpu: 40,
            memory_gib: 300,
            hugepages_1gi: 16,
        }),
    );
    assert_eq!(
        (booked.vcpu, booked.memory_gib, booked.hugepages_1gi),
        (40, 300, 16)
    );
    assert_eq!(
        (excess.vcpu, excess.memory_gib),
        (8, 44 + 16),
        "hugepages count as memory"
    );
    let (booked, _) = host_resources(0, share, None);
    assert_eq!(
        booked,
        HostBooking::default(),
        "MIG or slots alone book no host resources"
    );
}

#[test]
fn quota_charges_devices_per_class_and_host_excess() {
    let req = request(json!({ "devices": [{ "class": "gpu", "count": 2 }, { "class": "nic.vf", "count": 1 }, { "class": "gpu", "count": 1 }] })).unwrap();
    let charge = quota_charge(
        &req,
        HostBooking {
            vcpu: 4,
            memory_gib: 0,
            hugepages_1gi: 0,
        },
    );
    assert_eq!(charge.get("gpu"), Some(&3));
    assert_eq!(charge.get("nic.vf"), Some(&1));
    assert_eq!(charge.get("vcpu"), Some(&4));
    assert_eq!(charge.get("memoryGiB"), None);
}

#[test]
fn cost_is_rounded_up_to_the_minor_unit() {
    assert_eq!(cost_minor(8, 3_600_000, 250), 2000);
    assert_eq!(cost_minor(1, 1, 250), 1);
    assert_eq!(cost_minor(1, 0, 250), 0);
    assert_eq!(cost_minor(3, 1_800_000, 99), 149);
}

#[test]
fn states_know_what_is_terminal_and_what_is_a_draft() {
    assert!(
        State::Released.is_terminal()
            && State::Expired.is_terminal()
            && State::Denied.is_terminal()
    );
    assert!(!State::Pending.is_terminal());
    assert!(State::AwaitingConfirmation.is_draft() && !State::Pending.is_draft());
    for state in State::ALL {
        assert_eq!(State::parse(state.as_str()), Some(state));
    }
}
