//! The RDB format as Redis 2.6 to 7.2 and Valkey 8 write it: one codec for snapshots,
//! DUMP/RESTORE and (later) the AOF base and full resync.
//!
//! `write` turns Kite's values into RDB records and `read` turns any record Redis has
//! ever written back into Kite's values. The compact encodings found inside records
//! (ziplist, listpack, intset, zipmap, LZF) have a file each.

pub mod intset;
pub mod listpack;
pub mod lzf;
pub mod read;
pub mod write;
pub mod ziplist;
pub mod zipmap;

/// What Kite writes unless told otherwise: Redis 7.0's version, which 7.0, 7.2, Valkey
/// and later load.
pub const VERSION_DEFAULT: u16 = 10;
/// The newest version Kite reads and may write (Redis 7.2).
pub const VERSION_MAX: u16 = 11;

/// Value type bytes.
pub mod ty {
    pub const STRING: u8 = 0;
    pub const LIST: u8 = 1;
    pub const SET: u8 = 2;
    pub const ZSET: u8 = 3;
    pub const HASH: u8 = 4;
    pub const ZSET_2: u8 = 5;
    pub const MODULE_PRE_GA: u8 = 6;
    pub const MODULE_2: u8 = 7;
    pub const HASH_ZIPMAP: u8 = 9;
    pub const LIST_ZIPLIST: u8 = 10;
    pub const SET_INTSET: u8 = 11;
    pub const ZSET_ZIPLIST: u8 = 12;
    pub const HASH_ZIPLIST: u8 = 13;
    pub const LIST_QUICKLIST: u8 = 14;
    pub const STREAM_LISTPACKS: u8 = 15;
    pub const HASH_LISTPACK: u8 = 16;
    pub const ZSET_LISTPACK: u8 = 17;
    pub const LIST_QUICKLIST_2: u8 = 18;
    pub const STREAM_LISTPACKS_2: u8 = 19;
    pub const SET_LISTPACK: u8 = 20;
    pub const STREAM_LISTPACKS_3: u8 = 21;
}

/// Opcodes that are not value types.
pub mod op {
    /// Valkey 8's per-slot sizes (cluster mode): three lengths, a hint only.
    pub const SLOT_INFO: u8 = 244;
    pub const FUNCTION2: u8 = 245;
    pub const FUNCTION_PRE_GA: u8 = 246;
    pub const MODULE_AUX: u8 = 247;
    pub const IDLE: u8 = 248;
    pub const FREQ: u8 = 249;
    pub const AUX: u8 = 250;
    pub const RESIZEDB: u8 = 251;
    pub const EXPIRETIME_MS: u8 = 252;
    pub const EXPIRETIME: u8 = 253;
    pub const SELECTDB: u8 = 254;
    pub const EOF: u8 = 255;
}

/// Special string encodings (a length byte starting with 11).
pub mod enc {
    pub const INT8: u8 = 0;
    pub const INT16: u8 = 1;
    pub const INT32: u8 = 2;
    pub const LZF: u8 = 3;
}

/// Quicklist 2 node containers.
pub const QUICKLIST_NODE_PLAIN: u64 = 1;
pub const QUICKLIST_NODE_PACKED: u64 = 2;

/// Stream entry flags inside a node's listpack.
pub const STREAM_ITEM_DELETED: i64 = 1;
pub const STREAM_ITEM_SAMEFIELDS: i64 = 2;

/// CRC-64/Jones, reflected, as Redis checks RDB files and DUMP payloads.
pub static CRC64: crc::Crc<u64, crc::Table<16>> =
    crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_REDIS);

pub fn crc64(data: &[u8]) -> u64 {
    CRC64.checksum(data)
}

/// A module's name, from the 64-bit id Redis stores before module data: nine 6-bit
/// characters above a 10-bit version.
pub fn module_name(id: u64) -> String {
    const CHARSET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut name = String::with_capacity(9);
    for i in (0..9).rev() {
        let c = (id >> (10 + 6 * i)) & 63;
        name.push(CHARSET[c as usize] as char);
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_matches_redis_check_value() {
        assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn module_names_decode() {
        // "ReJSON-RL" version 1, as the RedisJSON module registers itself.
        let name = b"ReJSON-RL";
        let charset = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut id = 0u64;
        for &c in name {
            id = (id << 6) | charset.iter().position(|&x| x == c).unwrap() as u64;
        }
        id = (id << 10) | 1;
        assert_eq!(module_name(id), "ReJSON-RL");
    }
}
