//! Builds the default policies in `plugins/` as WebAssembly components (wasm32-wasip2), so
//! the `orl` binary embeds them and a fresh install runs the same WebAssembly path as an
//! uploaded plugin. Each policy is a plain library the host also links natively
//! (`orl-placer-default`, …) wrapped by a thin component crate (`…-component`), which is
//! what is built here; the paths reach the crate as `ORL_<NAME>_WASM`.

use std::path::PathBuf;
use std::process::Command;

const PLUGINS: &[(&str, &str)] = &[
    ("orl-placer-default-component", "ORL_PLACER_DEFAULT_WASM"),
    (
        "orl-preemptor-default-component",
        "ORL_PREEMPTOR_DEFAULT_WASM",
    ),
    (
        "orl-spend-guard-default-component",
        "ORL_SPEND_GUARD_DEFAULT_WASM",
    ),
];

fn main() {
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .expect("host/ lives in the workspace")
        .to_path_buf();
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out.join("wasm");
    for path in ["plugins", "wit"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir);
    for (package, _) in PLUGINS {
        command.args(["-p", package]);
    }
    // The outer build's settings are for the host target, not for the components.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_MAKEFLAGS",
    ] {
        command.env_remove(var);
    }
    let status = command
        .status()
        .expect("running cargo to build the default policies");
    assert!(
        status.success(),
        "building the default policies for wasm32-wasip2 failed (is the target installed? `rustup target add wasm32-wasip2`)"
    );
    for (package, var) in PLUGINS {
        let file = target_dir
            .join("wasm32-wasip2/release")
            .join(format!("{}.wasm", package.replace('-', "_")));
        assert!(file.exists(), "{} was not built", file.display());
        println!("cargo:rustc-env={var}={}", file.display());
    }
}
