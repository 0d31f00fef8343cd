//! `stoker bench pipeline` end to end: the pipeline and its floor take turns and report both,
//! with the floor from the same dataset or from the same images stored another way.

use stoker_sample_data::{SampleDataSpec, write_image_folder};

use crate::support::{path_str, stoker, text};

fn report(args: &[&str]) -> serde_json::Value {
    let output = stoker(args);
    assert!(output.status.success(), "{}", text(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", text(&output)))
}

#[test]
fn bench_pipeline_reports_the_pipeline_against_a_floor_in_turns() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
    let images = dir.path().join("images");
    write_image_folder(&images, SampleDataSpec { classes: 2, images_per_class: 20, seed: 3 }).unwrap_or_else(|error| panic!("{error}"));
    let (seekable, verbatim) = (dir.path().join("seekable"), dir.path().join("verbatim"));
    for (output, extra) in [(&seekable, None), (&verbatim, Some("--verbatim"))] {
        let mut args = vec!["pack", "--input", path_str(&images), "--output", path_str(output)];
        args.extend(extra);
        let packed = stoker(&args);
        assert!(packed.status.success(), "{}", text(&packed));
    }
    let common = ["bench", "pipeline", "--threads", "1", "--batch-size", "4", "--size", "64", "--seconds", "1", "--rounds", "2", "--json"];
    let own = report(&[&common[..], &["--data", path_str(&seekable)]].concat());
    for key in ["images_per_sec", "floor_images_per_sec", "ratio_to_floor"] {
        let value = own[key].as_f64().unwrap_or(0.0);
        assert!(value > 0.0 && value.is_finite(), "{key} = {value}: {own}");
    }
    assert_eq!((own["threads"].as_u64(), own["rounds"].as_u64(), own["replaced_samples"].as_u64()), (Some(1), Some(2), Some(0)));
    assert!(own["images"].as_u64().unwrap_or(0) > 0, "{own}");
    let ratio = own["images_per_sec"].as_f64().unwrap_or(0.0) / own["floor_images_per_sec"].as_f64().unwrap_or(1.0);
    assert!((ratio - own["ratio_to_floor"].as_f64().unwrap_or(0.0)).abs() < 1e-9, "{own}");

    let other = report(&[&common[..], &["--data", path_str(&seekable), "--floor-data", path_str(&verbatim)]].concat());
    assert!(other["floor_data"].as_str().is_some_and(|p| p.contains("verbatim")), "{other}");
    assert!(other["floor_images_per_sec"].as_f64().unwrap_or(0.0) > 0.0, "{other}");

    // --baseline-threads: the same turns at another thread count, and how both scale.
    let two = ["bench", "pipeline", "--threads", "2", "--batch-size", "4", "--size", "64", "--seconds", "1", "--rounds", "2", "--json"];
    let scaled = report(&[&two[..], &["--data", path_str(&seekable), "--baseline-threads", "1"]].concat());
    assert_eq!((scaled["threads"].as_u64(), scaled["baseline_threads"].as_u64()), (Some(2), Some(1)), "{scaled}");
    let number = |key: &str| scaled[key].as_f64().unwrap_or(0.0);
    for key in ["baseline_images_per_sec", "scaling", "floor_scaling"] {
        assert!(number(key) > 0.0 && number(key).is_finite(), "{key}: {scaled}");
    }
    assert!((number("scaling") - number("images_per_sec") / number("baseline_images_per_sec")).abs() < 1e-9, "{scaled}");
    assert!(own.get("scaling").is_none(), "no scaling without a baseline: {own}");
    let same = stoker(&[&two[..], &["--data", path_str(&seekable), "--baseline-threads", "2"]].concat());
    assert!(!same.status.success() && text(&same).contains("different count"), "{}", text(&same));

    // A floor dataset of other images is refused, naming both counts.
    let smaller = dir.path().join("smaller");
    write_image_folder(&smaller.join("in"), SampleDataSpec { classes: 1, images_per_class: 5, seed: 1 })
        .unwrap_or_else(|error| panic!("{error}"));
    let packed = stoker(&["pack", "--input", path_str(&smaller.join("in")), "--output", path_str(&smaller.join("out"))]);
    assert!(packed.status.success(), "{}", text(&packed));
    let refused = stoker(&[&common[..], &["--data", path_str(&seekable), "--floor-data", path_str(&smaller.join("out"))]].concat());
    assert!(!refused.status.success());
    assert!(text(&refused).contains("has 5 samples and --data has 40"), "{}", text(&refused));
}
