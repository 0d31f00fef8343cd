//! The integer types tokens are stored as, by their numpy names, and a typed view of a run of
//! little-endian tokens in a mapped file.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How one token is stored: a little-endian integer of this type (numpy's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// `uint8`.
    Uint8,
    /// `int8`.
    Int8,
    /// `int16`.
    Int16,
    /// `uint16`: GPT-2's vocabulary (nanoGPT, llm.c's GPT-2 shards).
    Uint16,
    /// `int32`.
    Int32,
    /// `uint32`: llm.c's Llama 3 shards.
    Uint32,
    /// `int64`.
    Int64,
}

/// Every dtype, for messages and parsing.
pub const ALL_DTYPES: [TokenDtype; 7] =
    [TokenDtype::Uint8, TokenDtype::Int8, TokenDtype::Int16, TokenDtype::Uint16, TokenDtype::Int32, TokenDtype::Uint32, TokenDtype::Int64];

impl TokenDtype {
    /// Bytes per token.
    pub fn size(self) -> usize {
        match self {
            Self::Uint8 | Self::Int8 => 1,
            Self::Int16 | Self::Uint16 => 2,
            Self::Int32 | Self::Uint32 => 4,
            Self::Int64 => 8,
        }
    }

    /// numpy's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uint8 => "uint8",
            Self::Int8 => "int8",
            Self::Int16 => "int16",
            Self::Uint16 => "uint16",
            Self::Int32 => "int32",
            Self::Uint32 => "uint32",
            Self::Int64 => "int64",
        }
    }

    /// Whether `value` can be stored as this type.
    pub fn holds(self, value: i64) -> bool {
        let (min, max) = match self {
            Self::Uint8 => (0, i64::from(u8::MAX)),
            Self::Int8 => (i64::from(i8::MIN), i64::from(i8::MAX)),
            Self::Int16 => (i64::from(i16::MIN), i64::from(i16::MAX)),
            Self::Uint16 => (0, i64::from(u16::MAX)),
            Self::Int32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
            Self::Uint32 => (0, i64::from(u32::MAX)),
            Self::Int64 => (i64::MIN, i64::MAX),
        };
        (min..=max).contains(&value)
    }

    /// The type of Megatron-LM's dtype code (`DType` in `indexed_dataset.py`: 1 uint8, 2 int8,
    /// 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16). The float codes are not
    /// token types: `Err` says so.
    pub fn from_megatron_code(code: u8) -> Result<Self, String> {
        match code {
            1 => Ok(Self::Uint8),
            2 => Ok(Self::Int8),
            3 => Ok(Self::Int16),
            4 => Ok(Self::Int32),
            5 => Ok(Self::Int64),
            8 => Ok(Self::Uint16),
            6 | 7 => {
                Err(format!("dtype code {code} is a float type ({}): tokens are integers", if code == 6 { "float64" } else { "float32" }))
            }
            _ => Err(format!("dtype code {code} is not one of Megatron-LM's (1..=8)")),
        }
    }
}

impl TokenDtype {
    /// Megatron-LM's code of this type; `uint32` has none.
    pub fn megatron_code(self) -> Option<u8> {
        match self {
            Self::Uint8 => Some(1),
            Self::Int8 => Some(2),
            Self::Int16 => Some(3),
            Self::Int32 => Some(4),
            Self::Int64 => Some(5),
            Self::Uint16 => Some(8),
            Self::Uint32 => None,
        }
    }

    /// Append `token` as this type, little-endian (truncated to the type's width: writers
    /// check [`TokenDtype::holds`] first).
    pub fn encode(self, token: i64, out: &mut Vec<u8>) {
        out.extend_from_slice(&token.to_le_bytes()[..self.size()]);
    }
}

impl fmt::Display for TokenDtype {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for TokenDtype {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ALL_DTYPES.into_iter().find(|dtype| dtype.name() == text).ok_or_else(|| {
            let names: Vec<_> = ALL_DTYPES.iter().map(|dtype| dtype.name()).collect();
            format!("unknown token dtype {text:?}: one of {}", names.join(", "))
        })
    }
}

/// A run of tokens in a mapped file: its bytes (a whole number of tokens) and their type.
/// Reads each token from its bytes, so it needs no alignment.
#[derive(Clone, Copy, Debug)]
pub struct TokenSlice<'a> {
    bytes: &'a [u8],
    dtype: TokenDtype,
}

impl<'a> TokenSlice<'a> {
    /// The tokens in `bytes`, or `None` when `bytes` is not a whole number of tokens.
    pub fn new(bytes: &'a [u8], dtype: TokenDtype) -> Option<Self> {
        bytes.len().is_multiple_of(dtype.size()).then_some(Self { bytes, dtype })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The raw little-endian bytes (zero-copy, a slice of the mapping).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The storage type.
    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    /// Token `index`, widened to `i64`.
    pub fn get(&self, index: usize) -> Option<i64> {
        let size = self.dtype.size();
        let start = index.checked_mul(size)?;
        let bytes = self.bytes.get(start..start.checked_add(size)?)?;
        Some(decode(self.dtype, bytes))
    }

    /// Call `visit` with every token in order, widened to `i64` (one loop per type, so a scan
    /// of a large file runs at memory speed).
    pub fn for_each(&self, mut visit: impl FnMut(i64)) {
        macro_rules! each {
            ($type:ty, $size:literal) => {
                for chunk in self.bytes.chunks_exact($size) {
                    let mut array = [0u8; $size];
                    array.copy_from_slice(chunk);
                    visit(i64::from(<$type>::from_le_bytes(array)));
                }
            };
        }
        match self.dtype {
            TokenDtype::Uint8 => each!(u8, 1),
            TokenDtype::Int8 => each!(i8, 1),
            TokenDtype::Int16 => each!(i16, 2),
            TokenDtype::Uint16 => each!(u16, 2),
            TokenDtype::Int32 => each!(i32, 4),
            TokenDtype::Uint32 => each!(u32, 4),
            TokenDtype::Int64 => each!(i64, 8),
        }
    }
}

/// The token in `bytes` (exactly `dtype.size()` of them).
fn decode(dtype: TokenDtype, bytes: &[u8]) -> i64 {
    let mut array = [0u8; 8];
    let size = dtype.size().min(bytes.len());
    array[..size].copy_from_slice(&bytes[..size]);
    match dtype {
        TokenDtype::Uint8 => i64::from(array[0]),
        TokenDtype::Int8 => i64::from(array[0] as i8),
        TokenDtype::Int16 => i64::from(i16::from_le_bytes([array[0], array[1]])),
        TokenDtype::Uint16 => i64::from(u16::from_le_bytes([array[0], array[1]])),
        TokenDtype::Int32 => i64::from(i32::from_le_bytes([array[0], array[1], array[2], array[3]])),
        TokenDtype::Uint32 => i64::from(u32::from_le_bytes([array[0], array[1], array[2], array[3]])),
        TokenDtype::Int64 => i64::from_le_bytes(array),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_megatron_codes_match_its_enum() {
        for dtype in ALL_DTYPES {
            assert_eq!(dtype.name().parse::<TokenDtype>(), Ok(dtype));
        }
        assert!("float32".parse::<TokenDtype>().is_err());
        let codes = [(1, TokenDtype::Uint8), (2, TokenDtype::Int8), (3, TokenDtype::Int16), (4, TokenDtype::Int32)];
        for (code, dtype) in codes.into_iter().chain([(5, TokenDtype::Int64), (8, TokenDtype::Uint16)]) {
            assert_eq!(TokenDtype::from_megatron_code(code), Ok(dtype));
        }
        for dtype in ALL_DTYPES {
            assert_eq!(dtype.megatron_code().map(TokenDtype::from_megatron_code), (dtype != TokenDtype::Uint32).then_some(Ok(dtype)));
        }
        for code in [0, 6, 7, 9, 255] {
            assert!(TokenDtype::from_megatron_code(code).is_err(), "{code}");
        }
    }

    #[test]
    fn slices_decode_each_type_little_endian_without_alignment() {
        // One byte of padding first: the tokens start at an odd address.
        let bytes = [0xAA, 0x01, 0x80, 0xFF, 0xFF];
        let slice = TokenSlice::new(&bytes[1..], TokenDtype::Int16).unwrap_or_else(|| panic!("whole tokens"));
        assert_eq!((slice.len(), slice.get(0), slice.get(1), slice.get(2)), (2, Some(-32767), Some(-1), None));
        let unsigned = TokenSlice::new(&bytes[1..], TokenDtype::Uint16).unwrap_or_else(|| panic!("whole tokens"));
        let mut seen = Vec::new();
        unsigned.for_each(|token| seen.push(token));
        assert_eq!(seen, vec![0x8001, 0xFFFF]);
        assert!(TokenSlice::new(&bytes[..3], TokenDtype::Uint16).is_none());
        let wide = 0x0123_4567_89AB_CDEFi64.to_le_bytes();
        assert_eq!(TokenSlice::new(&wide, TokenDtype::Int64).and_then(|slice| slice.get(0)), Some(0x0123_4567_89AB_CDEF));
        assert_eq!(TokenSlice::new(&wide[..4], TokenDtype::Uint32).and_then(|slice| slice.get(0)), Some(0x89AB_CDEF));
    }
}
