//! Writes the seed corpora of the fuzz targets into `fuzz/corpus/<target>/` (or the folder given
//! as the first argument): small real inputs made with the project's own encoders, so the
//! fuzzers start from valid frames, shards, indexes, manifests, JPEGs and specs. Deterministic:
//! run it again and the committed files do not change.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --features seeds --bin seeds`

use std::error::Error;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use stoker_plan::ids::{CertKey, Epoch, JobId, LeaseId, Pass, Position, Rank, SessionId, ShardId, Step, WorkerId};
use stoker_plan::{CHECKPOINT_VERSION, Checkpoint, PlanSpec, Shuffle, Tail};
use stoker_proto::{
    BatchHeader, Chunk, ChunkGrant, ClusterStatus, ControlRequest, ControlResponse, CoordinatorStatus, DatasetInfo, Decoded, ErrorCode, HeldShards, JobSpec,
    LeaseProgress, RaftKind, RemoteError, StuckJob, TrainerHello, WorkerInfo, WorkerList, WorkerStatus,
};
use stoker_format::brace;
use stoker_format::index::{IndexBytes, ShardIndex, build_index};
use stoker_format::manifest::{Manifest, ManifestShard, PackedOrder};
use stoker_format::tar_writer::TarWriter;
use stoker_plan::transform::{OutputDtype, OutputLayout, Recipe, TransformSpec};
use stoker_proto::wire::{self, BATCH_HEADER_LIMIT, CONTROL_FRAME_LIMIT};
use stoker_fuzz::{WireKind, index_input, jpeg_input, transform_input};
use turbojpeg::{Image, PixelFormat, Subsamp, raw};

type Fallible<T> = Result<T, Box<dyn Error>>;

fn main() -> Fallible<()> {
    let root = std::env::args_os().nth(1).map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"), PathBuf::from);
    let jpegs = jpegs()?;
    let shards = shards(&jpegs)?;
    let mut corpus = Corpus { root, total: 0 };
    corpus.target("wire_frames", wire_frames()?)?;
    corpus.target("tar_reader", shards.clone())?;
    corpus.target("index_loader", index_inputs(&shards)?)?;
    corpus.target("manifest", manifests()?)?;
    corpus.target("jpeg_restart", jpeg_inputs(&jpegs)?)?;
    corpus.target("transform_spec", transform_specs()?)?;
    corpus.target("npy", npy_arrays())?;
    println!("{} bytes of seeds under {}", corpus.total, corpus.root.display());
    Ok(())
}

struct Corpus {
    root: PathBuf,
    total: usize,
}

impl Corpus {
    /// Replace the corpus of `target` with `seeds`.
    fn target(&mut self, target: &str, seeds: Vec<(String, Vec<u8>)>) -> Fallible<()> {
        let dir = self.root.join(target);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in seeds {
            self.total += bytes.len();
            std::fs::write(dir.join(name), bytes)?;
        }
        Ok(())
    }
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap_or_else(|error| panic!("{text}: {error}"))
}

fn nonzero(value: u32) -> NonZeroU32 {
    NonZeroU32::new(value).unwrap_or(NonZeroU32::MIN)
}

fn job_spec() -> JobSpec {
    JobSpec {
        name: "resnet".into(),
        dataset: "imagenet".into(),
        plan: PlanSpec {
            seed: 42,
            world_size: nonzero(2),
            batch_size: nonzero(32),
            shuffle: Shuffle::Block { samples: nonzero(64), blocks: nonzero(16) },
            tail: Tail::Pad,
        },
        transforms: TransformSpec::imagenet_train(224),
        prefetch: 4,
    }
}

fn dataset() -> DatasetInfo {
    DatasetInfo {
        name: "imagenet".into(),
        manifest: "/data/imagenet/manifest.json".into(),
        shard_counts: vec![1000, 998, 7],
        version: 0x1234,
    }
}

fn checkpoint() -> Checkpoint {
    Checkpoint { version: CHECKPOINT_VERSION, epoch: Epoch(3), position: Position(4096), order_fingerprint: 0xdead_beef }
}

fn wire_frames() -> Fallible<Vec<(String, Vec<u8>)>> {
    let worker = WorkerInfo { id: WorkerId(2), addr: addr("10.0.0.2:7001"), key: CertKey([7; 32]) };
    let requests = [
        ControlRequest::AddDataset { name: "imagenet".into(), manifest: "/data/imagenet".into() },
        ControlRequest::ListDatasets,
        ControlRequest::Attach { spec: job_spec(), rank: Rank(1), client: 99 },
        ControlRequest::OpenEpoch {
            job: JobId(1),
            rank: Rank(0),
            epoch: Epoch(2),
            start: Position(0),
            session: SessionId(5),
            pass: Pass(1),
            consumed: 0,
            holding: vec![Step(3), Step(4)],
        },
        ControlRequest::ReportProgress {
            job: JobId(1),
            rank: Rank(0),
            epoch: Epoch(2),
            start: Position(0),
            consumed: 17,
            wait_seconds: 1.5,
            batches: 17,
            samples: 544,
            session: SessionId(5),
            pass: Pass(1),
            missing: vec![Step(18)],
            workers_version: 0x5eed_0000_0000_0001,
        },
        ControlRequest::RegisterWorker { addr: addr("[::1]:7001"), threads: 8, instance: 77, attempt: 1 },
        ControlRequest::Heartbeat {
            worker: WorkerId(2),
            leases: vec![LeaseProgress { lease: LeaseId(9), finished: 3 }],
            images: 1000,
            stuck_jobs: vec![StuckJob::new(JobId(4), "two batches do not fit")],
            decoded: Decoded { samples: 2_400, cpu_seconds: 12.5 },
        },
        ControlRequest::PullChunks {
            worker: WorkerId(2),
            max: 4,
            held: vec![HeldShards { dataset_version: 0x1234, shards: vec![ShardId(0), ShardId(5)] }],
        },
        ControlRequest::ChunkFailed { worker: WorkerId(2), lease: LeaseId(9), reason: "connection lost".into() },
        ControlRequest::Status,
        ControlRequest::Detach { job: JobId(1), rank: Rank(0), session: SessionId(5) },
        ControlRequest::ChunkFatal { worker: WorkerId(2), lease: LeaseId(9), reason: "shard-3: key x: bad JPEG".into() },
        ControlRequest::RemoveJob { name: "resnet".into(), job: JobId(3), force: true },
        ControlRequest::Raft { kind: RaftKind::AppendEntries, payload: br#"{"vote":{"leader_id":{"term":1,"node_id":1}}}"#.to_vec() },
        ControlRequest::AddNode { id: 3, addr: "coord-3:7000".into() },
    ];
    let chunk = Chunk { job: JobId(1), epoch: Epoch(2), start: Position(0), first_step: Step(8), rank: Rank(1), steps: 4 };
    let grant = ChunkGrant {
        lease: LeaseId(9),
        chunk,
        spec: job_spec(),
        manifest: "/data/imagenet/manifest.json".into(),
        dataset_version: 0x1234,
        session: SessionId(5),
        trainer: CertKey::UNCHECKED,
        next_shards: vec![ShardId(3), ShardId(1)],
    };
    let status = ClusterStatus {
        coordinator: "coord-1:7000".into(),
        coordinators: vec![CoordinatorStatus {
            id: 1,
            addr: "coord-1:7000".into(),
            role: "leader".into(),
            term: 2,
            last_log: 40,
            applied: 40,
            leader: Some(1),
            joined: vec![1, 2],
        }],
        datasets: 1,
        workers: vec![WorkerStatus {
            info: worker,
            alive: true,
            threads: 8,
            chunks_in_flight: 2,
            images_per_sec: 812.5,
            images_per_core_sec: 203.1,
            stuck_jobs: vec![],
        }],
        jobs: vec![],
    };
    let results: [Result<ControlResponse, RemoteError>; 10] = [
        Ok(ControlResponse::Datasets { datasets: vec![dataset()] }),
        Ok(ControlResponse::Attached {
            job: JobId(1),
            dataset: dataset(),
            workers: WorkerList { version: 0x5eed_0000_0000_0002, workers: vec![worker] },
            checkpoint: Some(checkpoint()),
            session: SessionId(5),
        }),
        Ok(ControlResponse::ProgressRecorded { workers: Some(WorkerList { version: 0x5eed_0000_0000_0003, workers: vec![worker] }), run_known: true }),
        Ok(ControlResponse::WorkerRegistered {
            worker: WorkerId(2),
            heartbeat_millis: 1000,
            lease_ttl_millis: 10_000,
            lease_stall_millis: 60_000,
        }),
        Ok(ControlResponse::HeartbeatAck { revoked: vec![LeaseId(8)], live_jobs: vec![JobId(1)] }),
        Ok(ControlResponse::Chunks { grants: vec![grant] }),
        Ok(ControlResponse::Status { status }),
        Ok(ControlResponse::MembershipChanged { voters: vec![(1, "coord-1:7000".into()), (2, "coord-2:7000".into())] }),
        Err(RemoteError::new(ErrorCode::NotLeader { leader_hint: Some(addr("10.0.0.1:7000")) }, "ask the leader")),
        Err(RemoteError::new(ErrorCode::Forbidden, "not your session")),
    ];
    let hello = TrainerHello { job: JobId(1), rank: Rank(1), session: SessionId(5), bulk: true };
    let header = BatchHeader {
        job: JobId(1),
        epoch: Epoch(2),
        start: Position(0),
        rank: Rank(1),
        step: Step(8),
        shape: [2, 3, 4, 4],
        dtype: OutputDtype::Float(stoker_plan::transform::FloatDtype::F16),
        layout: OutputLayout::Nchw,
        labels: vec![3, -1],
        keys: vec!["n01440764/img_0001".into(), "n01440764/img_0002".into()],
        replaced: vec![1],
        corrupt: vec![],
        dataset_version: 0x1234,
        plan_digest: 0x5678,
        payload_len: 2 * 3 * 4 * 4 * 2,
        checksum: 0x9abc,
    };

    for result in &results {
        let frame = wire::encode(result, CONTROL_FRAME_LIMIT)?;
        let decoded = wire::decode_body::<Result<ControlResponse, RemoteError>>(&frame[4..])?;
        assert_eq!(&decoded, result, "a seed frame decodes to what was encoded");
    }
    let mut seeds = Vec::new();
    let mut add = |kind: WireKind, name: String, frames: Vec<Vec<u8>>| {
        let mut bytes = vec![kind.byte()];
        frames.iter().for_each(|frame| bytes.extend_from_slice(frame));
        seeds.push((name, bytes));
    };
    for (i, request) in requests.iter().enumerate() {
        add(WireKind::ControlRequest, format!("request-{i:02}"), vec![wire::encode(request, CONTROL_FRAME_LIMIT)?]);
    }
    for (i, result) in results.iter().enumerate() {
        add(WireKind::ControlResult, format!("response-{i:02}"), vec![wire::encode(result, CONTROL_FRAME_LIMIT)?]);
    }
    // A stream of two frames, as a connection carries them.
    let two = vec![
        wire::encode(&hello, CONTROL_FRAME_LIMIT)?,
        wire::encode(&TrainerHello { session: SessionId(6), ..hello }, CONTROL_FRAME_LIMIT)?,
    ];
    add(WireKind::TrainerHello, "hello-two-frames".into(), two);
    add(WireKind::HelloResult, "hello-ok".into(), vec![wire::encode(&Ok::<(), RemoteError>(()), CONTROL_FRAME_LIMIT)?]);
    let superseded = Err::<(), _>(RemoteError::new(ErrorCode::Superseded, "a newer trainer attached as rank 1"));
    add(WireKind::HelloResult, "hello-superseded".into(), vec![wire::encode(&superseded, CONTROL_FRAME_LIMIT)?]);
    add(WireKind::BatchHeader, "batch-header".into(), vec![wire::encode(&header, BATCH_HEADER_LIMIT)?]);
    Ok(seeds)
}

/// Small JPEGs with restart markers, as `stoker pack` writes them (one interval per MCU) and as
/// cameras do (one per MCU row), in several subsamplings: `(name, jpeg)`.
fn jpegs() -> Fallible<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for (name, subsamp, width, height) in [
        ("444", Subsamp::None, 24, 16),
        ("420", Subsamp::Sub2x2, 40, 24),
        ("422", Subsamp::Sub2x1, 33, 17),
        ("gray", Subsamp::Gray, 20, 12),
    ] {
        let plain = compress(width, height, subsamp, None)?;
        let seekable = stoker_pipeline::make_seekable(&plain, 1 << 20).ok_or("make_seekable refused a fresh JPEG")?;
        out.push((format!("{name}-per-mcu"), seekable));
    }
    out.push(("420-per-row".into(), compress(40, 40, Subsamp::Sub2x2, Some(1))?));
    out.push(("444-two-rows".into(), compress(16, 32, Subsamp::None, Some(2))?));
    for (name, jpeg) in &out {
        stoker_pipeline::fuzzing::restart_layout(jpeg).ok_or_else(|| format!("{name}: the restart layout does not parse"))?;
    }
    Ok(out)
}

/// A `width` × `height` gradient as a baseline JPEG, with a restart marker every `rows` MCU rows.
fn compress(width: usize, height: usize, subsamp: Subsamp, rows: Option<i32>) -> Fallible<Vec<u8>> {
    let pixels: Vec<u8> = (0..width * height * 3).map(|i| ((i / 3 % width) * 9 + (i / 3 / width) * 5 + (i % 3) * 60) as u8).collect();
    let Some(rows) = rows else {
        let image = Image { pixels: pixels.as_slice(), width, pitch: width * 3, height, format: PixelFormat::RGB };
        let mut compressor = turbojpeg::Compressor::new()?;
        compressor.set_quality(75)?;
        compressor.set_subsamp(subsamp)?;
        return Ok(compressor.compress_to_vec(image)?);
    };
    // TurboJPEG's safe API has no restart setting: the raw one, as `decode::transcode` uses it.
    // SAFETY: a fresh handle, used and destroyed here; `pixels` holds `height` rows of `width`
    // RGB pixels; TurboJPEG allocates the output, which is copied and then freed with tj3Free.
    unsafe {
        let handle = raw::tj3Init(raw::TJINIT_TJINIT_COMPRESS as _);
        if handle.is_null() {
            return Err("tj3Init failed".into());
        }
        let set = |param: raw::TJPARAM, value: i32| raw::tj3Set(handle, param as _, value);
        let status = set(raw::TJPARAM_TJPARAM_QUALITY, 75)
            | set(raw::TJPARAM_TJPARAM_SUBSAMP, subsamp as i32)
            | set(raw::TJPARAM_TJPARAM_RESTARTROWS, rows);
        let (mut output, mut size): (*mut u8, raw::size_t) = (std::ptr::null_mut(), 0);
        let compressed = status == 0
            && raw::tj3Compress8(
                handle,
                pixels.as_ptr(),
                width as _,
                (width * 3) as _,
                height as _,
                raw::TJPF_TJPF_RGB as _,
                &mut output,
                &mut size,
            ) == 0;
        let bytes = (compressed && !output.is_null()).then(|| std::slice::from_raw_parts(output, size as usize).to_vec());
        raw::tj3Free(output.cast());
        raw::tj3Destroy(handle);
        bytes.ok_or_else(|| "tj3Compress8 failed".into())
    }
}

/// WebDataset shards written by the project's tar writer: `(name, tar)`.
fn shards(jpegs: &[(String, Vec<u8>)]) -> Fallible<Vec<(String, Vec<u8>)>> {
    let tar = |members: &[(&str, &[u8])]| -> Fallible<Vec<u8>> {
        let mut writer = TarWriter::new(Vec::new());
        for (name, data) in members {
            writer.append(name, data)?;
        }
        Ok(writer.finish()?)
    };
    let long_key = format!("{}/sample", "deep-folder".repeat(12));
    let (long_jpg, long_cls) = (format!("{long_key}.jpg"), format!("{long_key}.cls"));
    Ok(vec![
        (
            "samples.tar".into(),
            tar(&[
                ("n01/img_0001.jpg", &jpegs[0].1),
                ("n01/img_0001.cls", b"0"),
                ("n02/img_0002.JPG", &jpegs[3].1),
                ("n02/img_0002.cls", b"1"),
                ("README", b"not a sample"),
                ("n03/img_0003.seg.png", b"\x89PNG"),
            ])?,
        ),
        ("pax-long-name.tar".into(), tar(&[(long_jpg.as_str(), b"JPEG"), (long_cls.as_str(), b"7")])?),
        ("empty-member.tar".into(), tar(&[("a.txt", b""), ("a.json", b"{}")])?),
    ])
}

fn index_inputs(shards: &[(String, Vec<u8>)]) -> Fallible<Vec<(String, Vec<u8>)>> {
    let mut seeds = Vec::new();
    for (name, shard) in shards {
        let index = build_index(shard)?;
        ShardIndex::from_bytes(IndexBytes::Owned(index.clone()), shard, Path::new(name))?;
        seeds.push((format!("{name}.idx"), index_input::encode(0, &index, shard)));
    }
    // An index of another shard, with the shard fields and the checksum left to the target.
    let (first, second) = (&shards[0].1, &shards[2].1);
    let index = build_index(first)?;
    seeds.push(("fixed-up.idx".into(), index_input::encode(index_input::FIX_SHARD | index_input::FIX_CHECKSUM, &index, second)));
    Ok(seeds)
}

fn manifests() -> Fallible<Vec<(String, Vec<u8>)>> {
    let shard = |uri: &str, samples, bytes| ManifestShard { uri: uri.into(), samples, bytes };
    let plain = Manifest::new(
        vec![shard("train-000000.tar", 1000, 110_000_000), shard("/abs/train-000001.tar", 998, 109_000_000)],
        vec!["tench".into(), "goldfish".into()],
        None,
    );
    let packed = Manifest::new(
        vec![shard("file:///data/a.tar", 5, 5120), shard("s3://bucket/imagenet/b.tar", 3, 3072)],
        Vec::new(),
        Some(PackedOrder::Shuffled { seed: 7 }),
    );
    let folder = Manifest::new(vec![shard("a.tar", 1, 1024)], vec!["only".into()], Some(PackedOrder::Folder));
    let mut seeds = Vec::new();
    for (name, manifest) in [("plain.json", plain), ("packed.json", packed), ("folder.json", folder)] {
        let text = format!("{}\n", serde_json::to_string_pretty(&manifest)?);
        Manifest::parse(&text, Path::new(name))?;
        seeds.push((name.to_string(), text.into_bytes()));
    }
    for (i, pattern) in
        ["train-{000000..000127}.tar", "{train,val}-{0..3}.tar", "s3://bucket/key/a.tar", "file:///data/a.tar"].into_iter().enumerate()
    {
        brace::expand(pattern)?;
        seeds.push((format!("pattern-{i}"), pattern.as_bytes().to_vec()));
    }
    Ok(seeds)
}

fn jpeg_inputs(jpegs: &[(String, Vec<u8>)]) -> Fallible<Vec<(String, Vec<u8>)>> {
    let mut seeds = Vec::new();
    for (i, (name, jpeg)) in jpegs.iter().enumerate() {
        // A small region at full scale and one at 1/2 (scale byte + 1 = M in M/8), as fractions
        // of the image (x, y, size) that the target maps into it.
        let params: [u8; jpeg_input::PARAMS] = [7, 40 + 20 * i as u8, 30, 20, 1, 128, 64 + 10 * i as u8, 10];
        let layout = stoker_pipeline::fuzzing::restart_layout(jpeg).ok_or_else(|| format!("{name}: no restart layout"))?;
        let (width, height) = layout.size();
        let region = [width * (40 + 20 * i as u32) / 256, height * 30 / 256, 1, 1];
        let mut scratch = stoker_pipeline::fuzzing::RestartScratch::default();
        layout.band(jpeg, 8, region, &mut scratch, &mut Vec::new()).ok_or_else(|| format!("{name}: no band for {region:?}"))?;
        let mut bytes = jpeg.clone();
        bytes.extend_from_slice(&params);
        seeds.push((format!("{name}.jpg"), bytes));
    }
    Ok(seeds)
}

fn transform_specs() -> Fallible<Vec<(String, Vec<u8>)>> {
    let specs = [
        ("imagenet-train", 500, 375, r#"{"transforms":[{"type":"RandomResizedCrop","size":224},{"type":"RandomHorizontalFlip"}]}"#),
        (
            "eval-normalized",
            375,
            500,
            r#"{"transforms":[{"type":"Resize","shorter_side":256,"interpolation":"bicubic"},{"type":"CenterCrop","size":[224,200]},
{"type":"Normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225],"dtype":"f16"}],"layout":"NCHW","on_error":"fail"}"#,
        ),
        (
            "rrc-options",
            1000,
            10,
            r#"{"transforms":[{"type":"RandomHorizontalFlip","p":0.25},{"type":"RandomResizedCrop","size":[64,32],"scale":[0.5,1.0],
"ratio":[0.75,1.3333333333333333],"interpolation":"nearest"}],"dct_scaling":false,"max_image_pixels":1000000}"#,
        ),
        ("center-crop-pads", 100, 50, r#"{"transforms":[{"type":"CenterCrop","size":120}]}"#),
        (
            "augmentations",
            640,
            427,
            r#"{"transforms":[{"type":"RandomResizedCrop","size":96},{"type":"ColorJitter","brightness":[0.6,1.4],"contrast":[0.6,1.4],
"saturation":[0.6,1.4],"hue":[-0.1,0.1]},{"type":"RandomGrayscale","p":0.2},{"type":"GaussianBlur","kernel_size":[5,3],"sigma":[0.1,2.0]},
{"type":"RandAugment","num_ops":2,"magnitude":9,"num_magnitude_bins":31},{"type":"TrivialAugmentWide"},
{"type":"RandomErasing","p":0.5,"scale":[0.02,0.33],"ratio":[0.3,3.3],"value":[124,116,104]}]}"#,
        ),
        (
            "geometric-augmentations",
            320,
            240,
            r#"{"transforms":[{"type":"RandomResizedCrop","size":64},{"type":"AutoAugment","policy":"imagenet"},
{"type":"RandomRotation","degrees":30},{"type":"RandomAffine","degrees":[-10,40],"translate":[0.2,0.1],"scale":[0.7,1.3],
"shear":[-8,8,0,5]}]}"#,
        ),
        (
            "fields",
            320,
            240,
            r#"{"transforms":[{"type":"RandomResizedCrop","size":64}],"fields":{"image":{"from":"jpg;png;webp"},"label":{"from":"cls"},
"caption":{"from":"txt"},"meta":{"from":"json","missing":{"default":{}}},"raw":{"from":"bin","kind":"bytes"},"arr":{"from":"npy","missing":"replace"}}}"#,
        ),
    ];
    let mut seeds = Vec::new();
    for (i, (name, width, height, json)) in specs.into_iter().enumerate() {
        Recipe::new(&serde_json::from_str::<TransformSpec>(json)?)?;
        seeds.push((format!("{name}.json"), transform_input::encode(width, height, 1000 + i as u64, json)));
    }
    Ok(seeds)
}

/// `.npy` members as NumPy 1.0 writes them (`np.save`): a float32 matrix, an int64 scalar, an
/// empty uint8 array, a float16 vector.
fn npy_arrays() -> Vec<(String, Vec<u8>)> {
    let arrays: [(&str, &str, &str, usize); 4] = [
        ("f32-3x4", "<f4", "(3, 4)", 48),
        ("i64-scalar", "<i8", "()", 8),
        ("u8-empty", "|u1", "(0, 2)", 0),
        ("f16-vector", "<f2", "(3,)", 6),
    ];
    let mut seeds = Vec::new();
    for (name, descr, shape, data_len) in arrays {
        let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend((0..data_len).map(|i| i as u8));
        seeds.push((format!("{name}.npy"), bytes));
    }
    seeds
}
