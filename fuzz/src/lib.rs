//! The input formats of the fuzz targets, shared by the targets (`fuzz_targets/`) and the seed
//! generator (`src/bin/seeds.rs`), so committed seeds always mean what the targets read.

/// `wire_frames`: the first byte picks the message type ([`WireKind`]); the rest is a byte
/// stream of frames of that type (4-byte length prefix, then the bincode body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireKind {
    /// `ControlRequest`, under `CONTROL_FRAME_LIMIT`.
    ControlRequest,
    /// `Result<ControlResponse, RemoteError>`, under `CONTROL_FRAME_LIMIT`.
    ControlResult,
    /// `TrainerHello`, under `CONTROL_FRAME_LIMIT`.
    TrainerHello,
    /// `Result<(), RemoteError>` (the answer to a hello), under `CONTROL_FRAME_LIMIT`.
    HelloResult,
    /// `BatchHeader`, under `BATCH_HEADER_LIMIT`.
    BatchHeader,
}

impl WireKind {
    /// Every kind, in the order of their selector bytes.
    pub const ALL: [Self; 5] = [Self::ControlRequest, Self::ControlResult, Self::TrainerHello, Self::HelloResult, Self::BatchHeader];

    /// The kind a selector byte picks (any byte picks one).
    pub fn from_byte(byte: u8) -> Self {
        Self::ALL[usize::from(byte) % Self::ALL.len()]
    }

    /// The selector byte of this kind.
    pub fn byte(self) -> u8 {
        Self::ALL.iter().position(|&kind| kind == self).unwrap_or(0) as u8
    }
}

/// `index_loader`: bit 0 of the first byte asks the target to write the shard's length and
/// region hash into the index header, bit 1 to recompute the index's trailing checksum, so that
/// mutated indexes get past those checks to the record validation. Then a little-endian u32
/// index length, the index bytes, and the shard bytes.
pub mod index_input {
    /// Write the shard's length and region hash into the index header.
    pub const FIX_SHARD: u8 = 1;
    /// Recompute the trailing checksum.
    pub const FIX_CHECKSUM: u8 = 2;

    /// Encode an input.
    pub fn encode(flags: u8, index: &[u8], shard: &[u8]) -> Vec<u8> {
        let mut out = vec![flags];
        out.extend_from_slice(&(index.len() as u32).to_le_bytes());
        out.extend_from_slice(index);
        out.extend_from_slice(shard);
        out
    }

    /// `(flags, index, shard)`, or `None` when the input is too short.
    pub fn decode(data: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&flags, rest) = data.split_first()?;
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let rest = &rest[4..];
        let index = rest.get(..len.min(rest.len()))?;
        Some((flags, index, &rest[index.len()..]))
    }
}

/// `jpeg_restart`: the JPEG, then [`jpeg_input::PARAMS`] bytes choosing the scales and regions.
pub mod jpeg_input {
    /// Trailing parameter bytes: two regions of four bytes each (scale, x, y, size).
    pub const PARAMS: usize = 8;

    /// `(jpeg, params)`, or `None` when the input is too short.
    pub fn decode(data: &[u8]) -> Option<(&[u8], [u8; PARAMS])> {
        let split = data.len().checked_sub(PARAMS)?;
        Some((&data[..split], data[split..].try_into().ok()?))
    }
}

/// `transform_spec`: source width (u32), height (u32) and augmentation seed (u64), little-endian,
/// then the spec's JSON.
pub mod transform_input {
    /// Bytes before the JSON.
    pub const PREFIX: usize = 16;

    /// Encode an input.
    pub fn encode(width: u32, height: u32, seed: u64, json: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(PREFIX + json.len());
        out.extend_from_slice(&width.to_le_bytes());
        out.extend_from_slice(&height.to_le_bytes());
        out.extend_from_slice(&seed.to_le_bytes());
        out.extend_from_slice(json.as_bytes());
        out
    }

    /// `(width, height, seed, json)`, or `None` when the input is too short.
    pub fn decode(data: &[u8]) -> Option<(u32, u32, u64, &[u8])> {
        let width = u32::from_le_bytes(data.get(0..4)?.try_into().ok()?);
        let height = u32::from_le_bytes(data.get(4..8)?.try_into().ok()?);
        let seed = u64::from_le_bytes(data.get(8..16)?.try_into().ok()?);
        Some((width, height, seed, &data[PREFIX..]))
    }
}

/// `shard` with the checksum of each tar header that the reader refuses for its checksum
/// rewritten to match, header after header: random mutations of a header nearly always break
/// its checksum, and this lets them reach the parsing behind it. (The targets also read the
/// bytes as they are, so the checksum test itself is fuzzed too.)
pub fn with_tar_checksums_fixed(shard: &[u8]) -> Vec<u8> {
    use stoker_format::error::ShardError;
    use stoker_format::tar_reader::{BLOCK, TarMembers};

    let mut bytes = shard.to_vec();
    for _ in 0..=bytes.len() / BLOCK as usize {
        let Some(Err(ShardError::BadChecksum { offset, .. })) = TarMembers::new(&bytes).find(Result::is_err) else { break };
        let Some(header) = bytes.get_mut(offset as usize..offset as usize + BLOCK as usize) else { break };
        header[148..156].fill(b' ');
        let sum: u32 = header.iter().map(|&byte| u32::from(byte)).sum();
        header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    }
    bytes
}
