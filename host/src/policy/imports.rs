//! What a component may import and export, checked on its bytes before it is compiled: a
//! plugin that needs something the host will not give is refused in milliseconds with the
//! name of what it asked for, not after a compile of tens of seconds with linker text.
//!
//! A plugin may import `orl:policy/types` and `orl:policy/log` of a version the host
//! serves ([`super::PolicyVersion`]), and the WASI 0.2 interfaces the host links. Of those, `wasi:sockets` is linked to
//! implementations that refuse every call (language runtimes import it whether or not a
//! policy uses it), and the environment, arguments and stdio are empty. Anything else —
//! `wasi:http`, another package, another version of `orl:policy` — is refused. A plugin
//! exports only the function of its world; an exported interface of any package is refused.

use wasmparser::{ComponentExternalKind, ComponentTypeRef, Encoding, Parser, Payload};

use super::PolicyVersion;

/// The packages and versions of the policy interfaces this host serves, for messages:
/// `orl:policy@0.1.0 or orl:policy@0.2.0`.
pub fn served_packages() -> String {
    let all: Vec<&str> = PolicyVersion::ALL.iter().map(|v| v.as_str()).collect();
    all.join(" or ")
}

/// The WASI 0.2 interfaces the host links, by package.
const WASI: &[(&str, &[&str])] = &[
    ("wasi:io", &["error", "poll", "streams"]),
    ("wasi:clocks", &["monotonic-clock", "wall-clock"]),
    ("wasi:random", &["random", "insecure", "insecure-seed"]),
    ("wasi:filesystem", &["types", "preopens"]),
    (
        "wasi:cli",
        &[
            "environment",
            "exit",
            "stdin",
            "stdout",
            "stderr",
            "terminal-input",
            "terminal-output",
            "terminal-stdin",
            "terminal-stdout",
            "terminal-stderr",
        ],
    ),
    (
        "wasi:sockets",
        &[
            "network",
            "instance-network",
            "udp",
            "udp-create-socket",
            "tcp",
            "tcp-create-socket",
            "ip-name-lookup",
        ],
    ),
];

/// Checks the top-level imports and exports of the component `bytes`; the error names the
/// first import or export a plugin may not have, or says why the bytes are no component.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("not a WebAssembly component: {e}"))?;
        match payload {
            Payload::Version {
                encoding: Encoding::Module,
                ..
            } if depth == 0 => {
                return Err(
                    "a core WebAssembly module, not a component: build it for wasm32-wasip2 \
                     (or wrap it with `wasm-tools component new`)"
                        .into(),
                );
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    let import = import.map_err(|e| format!("not a WebAssembly component: {e}"))?;
                    // A type import (a world's `use`) grants nothing.
                    if !matches!(import.ty, ComponentTypeRef::Type(_)) {
                        check_import(import.name.name)?;
                    }
                }
            }
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    let export = export.map_err(|e| format!("not a WebAssembly component: {e}"))?;
                    if export.kind != ComponentExternalKind::Type {
                        check_export(export.name.name)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `name` split as `namespace:package/interface@version`.
fn interface(name: &str) -> Option<(&str, &str, &str)> {
    let (path, version) = name.split_once('@')?;
    let (package, interface) = path.split_once('/')?;
    Some((package, interface, version))
}

fn check_import(name: &str) -> Result<(), String> {
    let refused = |why: &str| Err(format!("the component imports `{name}`: {why}"));
    let served = served_packages();
    let Some((package, interface_name, version)) = interface(name) else {
        return refused(&format!(
            "a plugin may import only WASI 0.2 and {served} interfaces"
        ));
    };
    if package == "orl:policy" {
        let named = format!("{package}@{version}");
        if !PolicyVersion::ALL.iter().any(|v| v.as_str() == named) {
            return refused(&format!("this server serves {served}"));
        }
        if !["types", "log"].contains(&interface_name) {
            return refused(&format!("{named} has no such interface"));
        }
        return Ok(());
    }
    let Some((_, interfaces)) = WASI.iter().find(|(p, _)| *p == package) else {
        return refused(&format!(
            "a plugin may import only WASI 0.2 (io, clocks, random, filesystem, cli, sockets) \
             and {served} interfaces"
        ));
    };
    if !version.starts_with("0.2.") {
        return refused("this server links WASI 0.2");
    }
    if !interfaces.contains(&interface_name) {
        return refused(&format!(
            "{package}@0.2 has no such interface on this server"
        ));
    }
    Ok(())
}

fn check_export(name: &str) -> Result<(), String> {
    if name.contains(':') {
        return Err(format!(
            "the component exports `{name}`: a plugin exports only the function of its world \
             of {} (place, choose-victims or decide)",
            served_packages()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_export, check_import};

    #[test]
    fn wasi_and_the_policy_interfaces_pass_and_anything_else_is_named() {
        for name in [
            "orl:policy/types@0.1.0",
            "orl:policy/log@0.1.0",
            "orl:policy/types@0.2.0",
            "orl:policy/log@0.2.0",
            "wasi:io/poll@0.2.6",
            "wasi:sockets/tcp@0.2.0",
            "wasi:cli/environment@0.2.3",
        ] {
            assert_eq!(check_import(name), Ok(()), "{name}");
        }
        for name in [
            "wasi:http/outgoing-handler@0.2.0",
            "orl:policy/types@0.3.0",
            "orl:policy/log@1.0.0",
            "orl:policy/placer@0.2.0",
            "acme:policy/types@0.1.0",
            "wasi:io/poll@0.3.0",
            "wasi:io/mystery@0.2.0",
            "place",
        ] {
            let err = check_import(name).unwrap_err();
            assert!(err.contains(&format!("`{name}`")), "{err}");
        }
        assert_eq!(check_export("place"), Ok(()));
        assert!(check_export("acme:policy/placer@0.1.0").is_err());
    }
}
