//! The crate layering of DESIGN §2, read from every crate's `Cargo.toml`: which Stoker crates
//! each may depend on, which crates must stay free of tokio and quinn, and that no crate
//! depends on one above it. Cargo enforces nothing of this by itself; this test does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A crate of the workspace: where it is, its layer (a crate may depend only on lower layers),
/// the Stoker crates it may depend on (`None`: any lower one), and whether it must stay free of
/// an async runtime and of QUIC.
struct Rule {
    dir: &'static str,
    layer: u32,
    allowed_opt: Option<&'static [&'static str]>,
    no_runtime: bool,
}

const RULES: &[Rule] = &[
    Rule { dir: "common/plan", layer: 0, allowed_opt: Some(&[]), no_runtime: true },
    Rule { dir: "common/obs", layer: 0, allowed_opt: Some(&[]), no_runtime: false },
    Rule { dir: "common/format", layer: 1, allowed_opt: Some(&["stoker-plan"]), no_runtime: true },
    Rule { dir: "common/proto", layer: 1, allowed_opt: Some(&["stoker-plan"]), no_runtime: true },
    // Object-store access (ADR 0033): async, and on none of Stoker's crates.
    Rule { dir: "common/store", layer: 1, allowed_opt: Some(&[]), no_runtime: false },
    Rule { dir: "common/net", layer: 2, allowed_opt: Some(&["stoker-plan", "stoker-proto"]), no_runtime: false },
    Rule { dir: "worker/pipeline", layer: 2, allowed_opt: Some(&["stoker-plan", "stoker-format"]), no_runtime: true },
    Rule { dir: "coordinator/core", layer: 2, allowed_opt: Some(&["stoker-plan", "stoker-proto"]), no_runtime: true },
    Rule { dir: "testkit/sample-data", layer: 2, allowed_opt: Some(&["stoker-plan", "stoker-format"]), no_runtime: true },
    Rule { dir: "coordinator", layer: 3, allowed_opt: None, no_runtime: false },
    Rule { dir: "worker", layer: 3, allowed_opt: None, no_runtime: false },
    Rule { dir: "client", layer: 3, allowed_opt: Some(&["stoker-plan", "stoker-proto", "stoker-net", "stoker-obs"]), no_runtime: false },
    Rule { dir: "python", layer: 4, allowed_opt: None, no_runtime: false },
    Rule { dir: "testkit", layer: 4, allowed_opt: None, no_runtime: false },
    Rule { dir: "cli", layer: 5, allowed_opt: None, no_runtime: false },
    Rule { dir: "benches", layer: 5, allowed_opt: None, no_runtime: false },
];

/// Crates only tests and the demo may link: a normal dependency on them must be optional
/// (behind a feature such as `cli`'s `demo`), except for testkit itself.
const TEST_ONLY: &[&str] = &["stoker-testkit", "stoker-sample-data"];

/// Crates that bring an async runtime or QUIC.
const RUNTIME_CRATES: &[&str] = &["tokio", "quinn", "stoker-net", "stoker-obs"];

/// One dependency line of a manifest.
#[derive(Debug)]
struct Dependency {
    name: String,
    optional: bool,
}

/// A manifest read as far as this test needs: its package name and its normal dependencies
/// (`[dependencies]` and target-specific ones; not dev- or build-dependencies).
#[derive(Debug)]
struct Manifest {
    name: String,
    dependencies: Vec<Dependency>,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("testkit sits in the workspace root").to_owned()
}

/// A deliberately small reader of the manifests' shape in this repository: section headers,
/// then `name = ...` or `name.workspace = true` lines.
fn read_manifest(dir: &Path) -> Manifest {
    let path = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut section = String::new();
    let mut name_opt = None;
    let mut dependencies = Vec::new();
    for raw_line in text.lines() {
        let line = raw_line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_owned();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if section == "package" && key == "name" {
            name_opt = Some(value.trim().trim_matches('"').to_owned());
        }
        let normal = section == "dependencies" || (section.starts_with("target.") && section.ends_with(".dependencies"));
        if normal {
            let name = key.split('.').next().unwrap_or(key).trim_matches('"').to_owned();
            let optional = value.contains("optional = true");
            dependencies.push(Dependency { name, optional });
        }
    }
    Manifest { name: name_opt.unwrap_or_else(|| panic!("{}: no package name", path.display())), dependencies }
}

/// Every crate of the rules that exists in the tree (`coordinator/core` may not yet).
fn manifests() -> Vec<(&'static Rule, Manifest)> {
    let root = workspace_root();
    RULES
        .iter()
        .filter(|rule| root.join(rule.dir).join("Cargo.toml").is_file())
        .map(|rule| (rule, read_manifest(&root.join(rule.dir))))
        .collect()
}

#[test]
fn every_crate_depends_only_on_the_stoker_crates_its_layer_allows() {
    let crates = manifests();
    let layer_of: BTreeMap<&str, u32> = crates.iter().map(|(rule, manifest)| (manifest.name.as_str(), rule.layer)).collect();
    let mut broken = Vec::new();
    for (rule, manifest) in &crates {
        for dependency in manifest.dependencies.iter().filter(|dependency| dependency.name.starts_with("stoker-")) {
            if let Some(allowed) = rule.allowed_opt
                && !allowed.contains(&dependency.name.as_str())
            {
                broken.push(format!("{} ({}) may not depend on {}", manifest.name, rule.dir, dependency.name));
            }
            match layer_of.get(dependency.name.as_str()) {
                Some(&layer) if layer >= rule.layer => {
                    broken.push(format!(
                        "{} (layer {}) depends on {} (layer {layer}), which is not below it",
                        manifest.name, rule.layer, dependency.name
                    ));
                }
                Some(_) => {}
                None => broken.push(format!("{} depends on {}, which the layering rules do not know", manifest.name, dependency.name)),
            }
        }
    }
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

#[test]
fn the_pure_crates_bring_no_runtime_and_no_quic() {
    let mut broken = Vec::new();
    for (rule, manifest) in manifests().iter().filter(|(rule, _)| rule.no_runtime) {
        for dependency in &manifest.dependencies {
            if RUNTIME_CRATES.contains(&dependency.name.as_str()) {
                broken.push(format!("{} ({}) depends on {}", manifest.name, rule.dir, dependency.name));
            }
        }
    }
    assert!(broken.is_empty(), "crates that must stay pure of tokio and quinn are not:\n{}", broken.join("\n"));
}

#[test]
fn only_tests_and_the_demo_feature_reach_the_test_harness() {
    let mut broken = Vec::new();
    for (_, manifest) in manifests() {
        for dependency in &manifest.dependencies {
            let test_only = TEST_ONLY.contains(&dependency.name.as_str());
            let harness_itself = manifest.name == "stoker-testkit";
            if test_only && !dependency.optional && !harness_itself {
                broken.push(format!("{} depends on {} in every build", manifest.name, dependency.name));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_fuzz_targets_build_without_the_network_crates() {
    let fuzz = read_manifest(&workspace_root().join("fuzz"));
    let networked: Vec<&str> = fuzz
        .dependencies
        .iter()
        .map(|dependency| dependency.name.as_str())
        .filter(|name| ["stoker-net", "stoker-worker", "stoker-coordinator", "stoker-client", "tokio", "quinn"].contains(name))
        .collect();
    assert!(networked.is_empty(), "fuzz depends on {networked:?}");
}

#[test]
fn the_rules_cover_every_workspace_member() {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let members_text = manifest.split("members = [").nth(1).and_then(|rest| rest.split(']').next()).expect("a members list");
    let unknown: Vec<&str> = members_text
        .split(',')
        .map(|member| member.trim().trim_matches('"'))
        .filter(|member| !member.is_empty() && !RULES.iter().any(|rule| rule.dir == *member))
        .collect();
    assert!(unknown.is_empty(), "workspace members without a layering rule: {unknown:?}");
}
