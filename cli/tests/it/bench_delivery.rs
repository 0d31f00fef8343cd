//! `stoker bench delivery` runs every variant end to end and reports numbers for each.

use std::process::Command;

fn stoker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoker"))
}

#[test]
fn bench_delivery_measures_every_variant_and_refuses_an_empty_selection() {
    let output =
        stoker().args(["bench", "delivery", "--seconds", "0.3", "--batch-size", "4", "--size", "128", "--json"]).output().expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["batch_bytes"], 4 * 128 * 128 * 3);
    let variants = report["variants"].as_array().expect("variants");
    let names: Vec<&str> = variants.iter().filter_map(|variant| variant["name"].as_str()).collect();
    assert_eq!(names.len(), 8, "{names:?}");
    assert!(names[0].starts_with("tcp") && names[6].contains("mutual TLS") && names[7].contains("--max-udp-payload 65527"), "{names:?}");
    for variant in variants {
        for key in ["gigabytes_per_sec", "send_cpu_seconds_per_gb", "receive_cpu_seconds_per_gb"] {
            let value = variant[key].as_f64().unwrap_or(0.0);
            assert!(value > 0.0 && value.is_finite(), "{}: {key} = {value}", variant["name"]);
        }
        assert!(variant["batches"].as_u64().unwrap_or(0) > 0, "{variant}");
    }
    let none = stoker().args(["bench", "delivery", "--only", "no such variant"]).output().expect("run");
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no variant"), "{}", String::from_utf8_lossy(&none.stderr));
}
