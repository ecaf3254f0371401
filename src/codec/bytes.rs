//! Capturing a byte payload without `serde_json::Value`: a serializer that accepts only what
//! [`BytesCodec`](super::BytesCodec) encodes — bytes, a string, a sequence (or tuple, or
//! newtype) of integers 0–255 — and refuses everything else, so that the caller falls back to
//! the `Value` path and its errors.

use serde::de::value::Error;
use serde::ser::{self, Impossible, Serialize};

/// The bytes `value` serializes as, or `None` when it is not a byte payload.
pub(super) fn capture<T: Serialize + ?Sized>(value: &T) -> Option<Vec<u8>> {
    value.serialize(Capture).ok()
}

fn refuse<T>() -> Result<T, Error> {
    Err(ser::Error::custom("not a byte payload"))
}

macro_rules! refuse_scalars {
    ($($method:ident: $t:ty),* $(,)?) => {
        $(fn $method(self, _: $t) -> Result<Self::Ok, Error> { refuse() })*
    };
}

macro_rules! refuse_compounds {
    () => {
        fn serialize_none(self) -> Result<Self::Ok, Error> {
            refuse()
        }
        fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<Self::Ok, Error> {
            refuse()
        }
        fn serialize_unit(self) -> Result<Self::Ok, Error> {
            refuse()
        }
        fn serialize_unit_struct(self, _: &'static str) -> Result<Self::Ok, Error> {
            refuse()
        }
        fn serialize_unit_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
        ) -> Result<Self::Ok, Error> {
            refuse()
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> Result<Self::Ok, Error> {
            refuse()
        }
        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleStruct, Error> {
            refuse()
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, Error> {
            refuse()
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
            refuse()
        }
        fn serialize_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStruct, Error> {
            refuse()
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, Error> {
            refuse()
        }
    };
}

/// The whole payload.
struct Capture;

impl ser::Serializer for Capture {
    type Ok = Vec<u8>;
    type Error = Error;
    type SerializeSeq = Bytes;
    type SerializeTuple = Bytes;
    type SerializeTupleStruct = Impossible<Vec<u8>, Error>;
    type SerializeTupleVariant = Impossible<Vec<u8>, Error>;
    type SerializeMap = Impossible<Vec<u8>, Error>;
    type SerializeStruct = Impossible<Vec<u8>, Error>;
    type SerializeStructVariant = Impossible<Vec<u8>, Error>;

    refuse_scalars!(
        serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
        serialize_i64: i64, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_f32: f32, serialize_f64: f64, serialize_char: char,
    );
    refuse_compounds!();

    fn serialize_str(self, v: &str) -> Result<Vec<u8>, Error> {
        Ok(v.as_bytes().to_vec())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Vec<u8>, Error> {
        Ok(v.to_vec())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Vec<u8>, Error> {
        value.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Bytes, Error> {
        Ok(Bytes(Vec::with_capacity(len.unwrap_or(0))))
    }
    fn serialize_tuple(self, len: usize) -> Result<Bytes, Error> {
        Ok(Bytes(Vec::with_capacity(len)))
    }
}

/// A sequence of bytes being captured.
struct Bytes(Vec<u8>);

impl ser::SerializeSeq for Bytes {
    type Ok = Vec<u8>;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.0.push(value.serialize(Byte)?);
        Ok(())
    }
    fn end(self) -> Result<Vec<u8>, Error> {
        Ok(self.0)
    }
}

impl ser::SerializeTuple for Bytes {
    type Ok = Vec<u8>;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<Vec<u8>, Error> {
        Ok(self.0)
    }
}

/// One element: an integer 0–255 of any width.
struct Byte;

fn byte(n: impl TryInto<u8>) -> Result<u8, Error> {
    n.try_into()
        .map_err(|_| ser::Error::custom("not a byte payload"))
}

impl ser::Serializer for Byte {
    type Ok = u8;
    type Error = Error;
    type SerializeSeq = Impossible<u8, Error>;
    type SerializeTuple = Impossible<u8, Error>;
    type SerializeTupleStruct = Impossible<u8, Error>;
    type SerializeTupleVariant = Impossible<u8, Error>;
    type SerializeMap = Impossible<u8, Error>;
    type SerializeStruct = Impossible<u8, Error>;
    type SerializeStructVariant = Impossible<u8, Error>;

    refuse_scalars!(
        serialize_bool: bool, serialize_f32: f32, serialize_f64: f64, serialize_char: char,
        serialize_str: &str, serialize_bytes: &[u8],
    );
    refuse_compounds!();

    fn serialize_i8(self, v: i8) -> Result<u8, Error> {
        byte(v)
    }
    fn serialize_i16(self, v: i16) -> Result<u8, Error> {
        byte(v)
    }
    fn serialize_i32(self, v: i32) -> Result<u8, Error> {
        byte(v)
    }
    fn serialize_i64(self, v: i64) -> Result<u8, Error> {
        byte(v)
    }
    fn serialize_u8(self, v: u8) -> Result<u8, Error> {
        Ok(v)
    }
    fn serialize_u16(self, v: u16) -> Result<u8, Error> {
        byte(v)
    }
    fn serialize_u32(self, v: u32) -> Result<u8, Error> {
        byte(v)
    }
    fn serialize_u64(self, v: u64) -> Result<u8, Error> {
        byte(v)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<u8, Error> {
        value.serialize(self)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        refuse()
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        refuse()
    }
}

#[cfg(test)]
mod tests {
    use super::capture;

    #[test]
    fn captures_byte_payloads_only() {
        assert_eq!(capture(&vec![1u8, 2, 255]), Some(vec![1, 2, 255]));
        assert_eq!(capture(&[7u8; 3]), Some(vec![7, 7, 7]));
        assert_eq!(capture("hé"), Some("hé".as_bytes().to_vec()));
        assert_eq!(capture(&serde_json::json!([0, 9])), Some(vec![0, 9]));
        assert_eq!(capture(&vec![256u32]), None);
        assert_eq!(capture(&vec![-1i32]), None);
        assert_eq!(capture(&serde_json::json!({"a": 1})), None);
        assert_eq!(capture(&3u8), None);
        assert_eq!(capture(&vec!["a"]), None);
    }
}
