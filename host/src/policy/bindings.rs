//! The host side of `wit/`: one generated module per world, and the `log` interface the
//! host provides. Kept private to the policy module; callers use its small API.

#![allow(clippy::too_many_arguments)]

pub mod placer {
    wasmtime::component::bindgen!({ path: "../wit", world: "placer" });
}

/// The other worlds share the placer's `types` and `log`, so one set of records and one
/// log implementation serve every world.
pub mod preemptor {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "preemptor",
        with: {
            "orl:policy/types": super::placer::orl::policy::types,
            "orl:policy/log": super::placer::orl::policy::log,
        },
    });
}

pub mod spend_guard {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "spend-guard",
        with: {
            "orl:policy/types": super::placer::orl::policy::types,
            "orl:policy/log": super::placer::orl::policy::log,
        },
    });
}

use placer::orl::policy::log::{self, Level};

impl log::Host for super::PluginState {
    fn log(&mut self, level: Level, message: String) {
        let message: String = message.chars().take(1024).collect();
        let plugin = &self.plugin_id;
        match level {
            Level::Debug => tracing::debug!(%plugin, "{message}"),
            Level::Info => tracing::info!(%plugin, "{message}"),
            Level::Warn => tracing::warn!(%plugin, "{message}"),
            Level::Error => tracing::error!(%plugin, "{message}"),
        }
    }
}
