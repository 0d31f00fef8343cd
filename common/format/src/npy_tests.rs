use super::*;

/// `np.save(f, np.arange(12, dtype='<f4').reshape(3, 4))`, byte for byte.
const NUMPY_F32_3X4: &[u8] = &include!("npy_golden.in");

/// An `.npy` file as NumPy 1.0 lays it out, with `header` padded to 64 bytes and `data` after.
fn npy(header: &str, data: &[u8]) -> Vec<u8> {
    let mut text = header.to_string();
    while !(10 + text.len() + 1).is_multiple_of(64) {
        text.push(' ');
    }
    text.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&u16::try_from(text.len()).expect("short header").to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn reads_what_numpy_writes_in_place() {
    let array = parse_npy(NUMPY_F32_3X4).expect("numpy's own file");
    assert_eq!((array.dtype, array.shape.as_slice()), (NpyDtype::F32, &[3, 4][..]));
    assert_eq!(array.data.len(), 48);
    assert_eq!(&array.data[4..8], &1.0f32.to_le_bytes());
    assert_eq!(array.data.as_ptr(), NUMPY_F32_3X4[128..].as_ptr(), "a slice of the member, not a copy");
}

#[test]
fn reads_every_supported_dtype_and_scalar_and_empty_shapes() {
    for (descr, dtype) in [
        ("|u1", NpyDtype::U8),
        ("|b1", NpyDtype::Bool),
        ("<i4", NpyDtype::I32),
        ("<i8", NpyDtype::I64),
        ("<f2", NpyDtype::F16),
        ("<f4", NpyDtype::F32),
        ("<f8", NpyDtype::F64),
        ("<u2", NpyDtype::U16),
    ] {
        let data = vec![0u8; 2 * dtype.size()];
        let file = npy(&format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (2,), }}"), &data);
        assert_eq!(parse_npy(&file).map(|array| array.dtype), Ok(dtype), "{descr}");
    }
    let scalar = npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", &7i64.to_le_bytes());
    assert_eq!(parse_npy(&scalar).map(|array| array.shape), Ok(vec![]));
    let empty = npy("{'shape': (0, 2), 'fortran_order': False, 'descr': '|u1'}", &[]);
    assert_eq!(parse_npy(&empty).map(|array| array.shape), Ok(vec![0, 2]));
}

#[test]
fn a_header_that_lies_about_the_data_size_is_refused() {
    let short = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }", &[0; 16]);
    assert!(matches!(parse_npy(&short), Err(NpyError::SizeMismatch { actual: 16, .. })));
    let overflow = npy("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999, 99999999999999999999), }", &[0; 8]);
    assert!(parse_npy(&overflow).is_err());
    let huge = npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", &[0; 8]);
    match parse_npy(&huge) {
        Err(NpyError::SizeMismatch { expected, .. }) => assert_eq!(expected, "more than 2^64"),
        other => panic!("{other:?}"),
    }
    let long = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", &[0; 12]);
    assert!(matches!(parse_npy(&long), Err(NpyError::SizeMismatch { .. })));
}

#[test]
fn hostile_headers_are_refused_without_panicking() {
    let mut too_long = b"\x93NUMPY\x02\x00".to_vec();
    too_long.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(parse_npy(&too_long), Err(NpyError::HeaderTooLong { len: u32::MAX as usize }));
    let cut = &NUMPY_F32_3X4[..40];
    assert!(matches!(parse_npy(cut), Err(NpyError::NotNpy { .. })));
    assert!(matches!(parse_npy(b"\x93NUMPY\x09\x00"), Err(NpyError::Version { major: 9, minor: 0 })));
    assert!(matches!(parse_npy(b"PK\x03\x04 a zip"), Err(NpyError::NotNpy { .. })));
    let deep = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({}), }}", "1,".repeat(33));
    assert!(matches!(parse_npy(&npy(&deep, &[0])), Err(NpyError::BadHeader { .. })));
    for header in [
        "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
        "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
        "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }",
        "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1), }",
        "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
        "{'descr': '<f4', 'shape': (1,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } trailing",
        "{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }",
        "__import__('os')",
    ] {
        assert!(parse_npy(&npy(header, &[0; 4])).is_err(), "{header}");
    }
}

#[test]
fn every_truncation_and_byte_flip_of_a_real_file_returns() {
    for end in 0..NUMPY_F32_3X4.len() {
        let _ = parse_npy(&NUMPY_F32_3X4[..end]);
    }
    for index in 0..128 {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bytes = NUMPY_F32_3X4.to_vec();
            bytes[index] ^= flip;
            let _ = parse_npy(&bytes);
        }
    }
}
