//! NumPy `.npy` arrays read in place (issue 32: a sample's array fields). The header is a
//! Python dict literal (`{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`); it is
//! untrusted, so it is parsed by hand with bounds on its length, rank and element count, never
//! evaluated, and the data must be exactly as long as the header says: a header that lies
//! about its size is refused before anything is allocated for it.

/// Longest header accepted, in bytes (NumPy's own default `max_header_size` is 10,000).
pub const MAX_NPY_HEADER: usize = 64 * 1024;
/// Most dimensions accepted (NumPy's `NPY_MAXDIMS` is 32 in 1.x).
pub const MAX_NPY_DIMS: usize = 32;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Element types read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NpyDtype {
    /// `bool`, one byte.
    Bool,
    /// `uint8`.
    U8,
    /// `int8`.
    I8,
    /// `uint16`.
    U16,
    /// `int16`.
    I16,
    /// `uint32`.
    U32,
    /// `int32`.
    I32,
    /// `uint64`.
    U64,
    /// `int64`.
    I64,
    /// `float16`.
    F16,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
}

impl NpyDtype {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Self::Bool | Self::U8 | Self::I8 => 1,
            Self::U16 | Self::I16 | Self::F16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// NumPy's name (`float32`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Bool => "bool",
            Self::U8 => "uint8",
            Self::I8 => "int8",
            Self::U16 => "uint16",
            Self::I16 => "int16",
            Self::U32 => "uint32",
            Self::I32 => "int32",
            Self::U64 => "uint64",
            Self::I64 => "int64",
            Self::F16 => "float16",
            Self::F32 => "float32",
            Self::F64 => "float64",
        }
    }

    fn from_descr(descr: &str) -> Option<Self> {
        let (order, code) = descr.split_at_checked(1)?;
        let dtype = match code {
            "b1" => Self::Bool,
            "u1" => Self::U8,
            "i1" => Self::I8,
            "u2" => Self::U16,
            "i2" => Self::I16,
            "u4" => Self::U32,
            "i4" => Self::I32,
            "u8" => Self::U64,
            "i8" => Self::I64,
            "f2" => Self::F16,
            "f4" => Self::F32,
            "f8" => Self::F64,
            _ => return None,
        };
        // One-byte types have no byte order; wider ones must be little-endian, as every machine
        // Stoker runs on writes them.
        let fits = if dtype.size() == 1 { matches!(order, "|" | "<" | ">" | "=") } else { order == "<" };
        fits.then_some(dtype)
    }
}

/// An array: its dtype and shape, and its data as a slice of the member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyArray<'a> {
    /// Element type.
    pub dtype: NpyDtype,
    /// Shape, C order.
    pub shape: Vec<u64>,
    /// The elements, little-endian, exactly `product(shape) * dtype.size()` bytes.
    pub data: &'a [u8],
}

/// An `.npy` member that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NpyError {
    /// Not an `.npy` file, or cut before its header ends.
    #[error("not a NumPy .npy array: {problem}")]
    NotNpy {
        /// What is wrong.
        problem: &'static str,
    },
    /// A format version this reader does not know.
    #[error("npy format version {major}.{minor} is not supported (1.0, 2.0 and 3.0 are)")]
    Version {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// A header longer than [`MAX_NPY_HEADER`].
    #[error("npy header of {len} bytes is over the {MAX_NPY_HEADER} accepted")]
    HeaderTooLong {
        /// Header length it states.
        len: usize,
    },
    /// A header that is not the dict NumPy writes.
    #[error("npy header is not valid: {problem}")]
    BadHeader {
        /// What is wrong.
        problem: String,
    },
    /// A dtype that is not read: structured, big-endian, strings, objects, complex.
    #[error("npy dtype {descr:?} is not supported: save as little-endian bool, (u)int8-64, float16, float32 or float64")]
    Dtype {
        /// The header's `descr`.
        descr: String,
    },
    /// Fortran-order data.
    #[error("npy array is in Fortran order: save it C-contiguous (np.ascontiguousarray)")]
    FortranOrder,
    /// The data is not as long as the header's shape and dtype say.
    #[error("npy header says {expected} bytes of data but the member holds {actual}")]
    SizeMismatch {
        /// Bytes the header implies (or "more than 2^64").
        expected: String,
        /// Bytes present.
        actual: usize,
    },
}

/// Reads an `.npy` member in place: no copy, no allocation proportional to the data.
pub fn parse_npy(bytes: &[u8]) -> Result<NpyArray<'_>, NpyError> {
    let not_npy = |problem| NpyError::NotNpy { problem };
    if bytes.len() < MAGIC.len() + 2 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(not_npy("no \\x93NUMPY magic"));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len_bytes, after_len) = match (major, minor) {
        (1, 0) => (2, 10),
        (2 | 3, 0) => (4, 12),
        _ => return Err(NpyError::Version { major, minor }),
    };
    let Some(len_field) = bytes.get(8..after_len) else { return Err(not_npy("cut inside the header length")) };
    let header_len = if len_bytes == 2 {
        usize::from(u16::from_le_bytes([len_field[0], len_field[1]]))
    } else {
        let len = u32::from_le_bytes([len_field[0], len_field[1], len_field[2], len_field[3]]);
        usize::try_from(len).unwrap_or(usize::MAX)
    };
    if header_len > MAX_NPY_HEADER {
        return Err(NpyError::HeaderTooLong { len: header_len });
    }
    let Some(header) = bytes.get(after_len..after_len + header_len) else { return Err(not_npy("cut inside the header")) };
    let header = std::str::from_utf8(header).map_err(|_| NpyError::BadHeader { problem: "not UTF-8".into() })?;
    let parsed = parse_header(header)?;
    let dtype = NpyDtype::from_descr(&parsed.descr).ok_or(NpyError::Dtype { descr: parsed.descr })?;
    if parsed.fortran_order && parsed.shape.len() > 1 {
        return Err(NpyError::FortranOrder);
    }
    let data = &bytes[after_len + header_len..];
    let expected =
        parsed.shape.iter().try_fold(dtype.size() as u64, |total, &dim| total.checked_mul(dim)).filter(|&total| total == data.len() as u64);
    if expected.is_none() {
        let stated = parsed.shape.iter().try_fold(dtype.size() as u64, |total, &dim| total.checked_mul(dim));
        return Err(NpyError::SizeMismatch {
            expected: stated.map_or_else(|| "more than 2^64".to_string(), |total| total.to_string()),
            actual: data.len(),
        });
    }
    Ok(NpyArray { dtype, shape: parsed.shape, data })
}

struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// Parses `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }` and nothing else: the
/// three keys once each, in any order, with the trailing spaces and newline NumPy pads with.
fn parse_header(text: &str) -> Result<Header, NpyError> {
    let bad = |problem: &str| NpyError::BadHeader { problem: problem.to_string() };
    let mut cursor = Cursor { rest: text.trim_end_matches([' ', '\n', '\0']) };
    cursor.expect('{').ok_or_else(|| bad("does not start with '{'"))?;
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    loop {
        cursor.skip_space();
        if cursor.expect('}').is_some() {
            break;
        }
        let key = cursor.quoted().ok_or_else(|| bad("expected a quoted key"))?;
        cursor.skip_space();
        cursor.expect(':').ok_or_else(|| bad("expected ':' after a key"))?;
        cursor.skip_space();
        let repeated = match key {
            "descr" => descr.replace(cursor.quoted().ok_or_else(|| bad("descr is not a quoted string"))?.to_string()).is_some(),
            "fortran_order" => fortran_order.replace(cursor.boolean().ok_or_else(|| bad("fortran_order is not True or False"))?).is_some(),
            "shape" => shape.replace(cursor.shape().ok_or_else(|| bad("shape is not a tuple of at most 32 integers"))?).is_some(),
            _ => return Err(bad("unknown key (expected descr, fortran_order, shape)")),
        };
        if repeated {
            return Err(bad("a key is given twice"));
        }
        cursor.skip_space();
        if cursor.expect(',').is_none() {
            cursor.skip_space();
            cursor.expect('}').ok_or_else(|| bad("expected ',' or '}'"))?;
            break;
        }
    }
    cursor.skip_space();
    if !cursor.rest.is_empty() {
        return Err(bad("text after the dict"));
    }
    match (descr, fortran_order, shape) {
        (Some(descr), Some(fortran_order), Some(shape)) => Ok(Header { descr, fortran_order, shape }),
        _ => Err(bad("descr, fortran_order and shape must all be given")),
    }
}

struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn skip_space(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\n', '\t']);
    }

    fn expect(&mut self, wanted: char) -> Option<()> {
        self.rest = self.rest.strip_prefix(wanted)?;
        Some(())
    }

    fn quoted(&mut self) -> Option<&'a str> {
        let quote = self.rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let body = &self.rest[1..];
        let end = body.find(quote)?;
        self.rest = &body[end + 1..];
        Some(&body[..end])
    }

    fn boolean(&mut self) -> Option<bool> {
        for (word, value) in [("True", true), ("False", false)] {
            if let Some(rest) = self.rest.strip_prefix(word) {
                self.rest = rest;
                return Some(value);
            }
        }
        None
    }

    fn shape(&mut self) -> Option<Vec<u64>> {
        self.expect('(')?;
        let mut shape = Vec::new();
        loop {
            self.skip_space();
            if self.expect(')').is_some() {
                return Some(shape);
            }
            let digits = self.rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || digits > 20 || shape.len() == MAX_NPY_DIMS {
                return None;
            }
            shape.push(self.rest[..digits].parse().ok()?);
            self.rest = &self.rest[digits..];
            // NumPy writes `3L` in Python 2 headers.
            self.rest = self.rest.strip_prefix('L').unwrap_or(self.rest);
            self.skip_space();
            if self.expect(',').is_none() {
                self.skip_space();
                self.expect(')')?;
                return Some(shape);
            }
        }
    }
}

#[cfg(test)]
#[path = "npy_tests.rs"]
mod tests;
