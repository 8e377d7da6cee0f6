#![doc = include_str!("../README.md")]

mod records;

pub use records::{NO_DOMAIN, Unit};

/// The records the policy worlds exchange with the host (WIT interface `types`), with the
/// helpers of this crate on them: [`DeviceClass::code`](types::DeviceClass::code),
/// [`Candidates::free`](types::Candidates::free), [`Candidates::unit`](types::Candidates::unit),
/// [`DeviceRequest::accepts`](types::DeviceRequest::accepts),
/// [`Request::unit_count`](types::Request::unit_count), the node facts
/// ([`Candidates::node_name`](types::Candidates::node_name),
/// [`Candidates::node_region`](types::Candidates::node_region),
/// [`Candidates::node_labels`](types::Candidates::node_labels)) and the others documented
/// on each type.
pub mod types {
    pub use crate::placer::orl::policy::types::*;
}

/// Diagnostics to the host's log (WIT interface `log`): `log(Level::Debug, "…")`. Never
/// fails; the host may truncate long messages and drop those beyond a per-call limit.
pub mod log {
    pub use crate::placer::orl::policy::log::{Level, log};
}

/// The `placer` world: choose the units of one node for a request, or say why it is
/// unschedulable. Export an implementation with [`export_placer!`].
pub use placer::Guest as Placer;
/// The `preemptor` world: choose the spot bookings to terminate so that a request can be
/// placed. Export an implementation with [`export_preemptor!`].
pub use preemptor::Guest as Preemptor;
/// The `spend-guard` world: allow or refuse a charge against a budget. Export an
/// implementation with [`export_spend_guard!`].
pub use spend_guard::Guest as SpendGuard;

/// Exports a type implementing [`Placer`] as the component's `placer` world. Call it once,
/// at the top level of the policy crate.
#[macro_export]
macro_rules! export_placer {
    ($ty:ident) => {
        $crate::placer::export!($ty with_types_in $crate::placer);
    };
}

/// Exports a type implementing [`Preemptor`] as the component's `preemptor` world. Call it
/// once, at the top level of the policy crate.
#[macro_export]
macro_rules! export_preemptor {
    ($ty:ident) => {
        $crate::preemptor::export!($ty with_types_in $crate::preemptor);
    };
}

/// Exports a type implementing [`SpendGuard`] as the component's `spend-guard` world. Call
/// it once, at the top level of the policy crate.
#[macro_export]
macro_rules! export_spend_guard {
    ($ty:ident) => {
        $crate::spend_guard::export!($ty with_types_in $crate::spend_guard);
    };
}

// The generated bindings, one module per world. They are public only because the export
// macros expand in the policy's crate and name them from there. The `placer` module holds
// the shared interfaces (every type of `types`, used or not, and `log`); the other worlds
// reuse them with `with`, so each record is one Rust type whichever world uses it. Each
// module's custom section describes only its world's imports; the export macro adds the
// full world in the crate that exports it, so a component holds the world it implements
// and no other.

#[doc(hidden)]
#[allow(unsafe_code, missing_docs, clippy::too_many_arguments)] // generated bindings
pub mod placer {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "placer",
        pub_export_macro: true,
        default_bindings_module: "$crate::placer",
        generate_unused_types: true,
        additional_derives: [PartialEq, Eq],
    });
}

#[doc(hidden)]
#[allow(unsafe_code, missing_docs, clippy::too_many_arguments)] // generated bindings
pub mod preemptor {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "preemptor",
        pub_export_macro: true,
        default_bindings_module: "$crate::preemptor",
        with: {
            "orl:policy/types@0.2.0": crate::placer::orl::policy::types,
            "orl:policy/log@0.2.0": crate::placer::orl::policy::log,
        },
    });
}

#[doc(hidden)]
#[allow(unsafe_code, missing_docs, clippy::too_many_arguments)] // generated bindings
pub mod spend_guard {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "spend-guard",
        pub_export_macro: true,
        default_bindings_module: "$crate::spend_guard",
        with: {
            "orl:policy/types@0.2.0": crate::placer::orl::policy::types,
            "orl:policy/log@0.2.0": crate::placer::orl::policy::log,
        },
    });
}
