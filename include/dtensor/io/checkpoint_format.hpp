#pragma once
// The on-disk format of a checkpoint: a directory holding
//
//   index.json               what the checkpoint holds and where every byte of it is
//   index.json.xxh3          the index's XXH3, as `xxhsum -H3 index.json` writes it
//   rank-00000.safetensors   one data file per rank that saved data
//   rank-00003.safetensors   ...
//
// Data files are safetensors files (8-byte little-endian header length, a JSON
// header padded with spaces to a multiple of 8 bytes, then the raw little-endian
// row-major bytes), so Python reads them with `safetensors.numpy.load_file` (all
// but BF16, which numpy lacks: its bytes shifted left 16 are float32's,
// tests/checkpoint_read.py shows how). Element types: safetensors' F64, F32,
// BF16, F16, I64, U64, I32, U32, I8 and U8 (the index names them as name(DType)
// does: "float64", "bfloat16", ...). Each holds the chunks one rank saved, one per
// tensor, under the tensor's name: a chunk is a row-major box of the global tensor,
// the block the rank held. Chunks of 8-byte elements come first, then 4-, 2- and
// 1-byte ones, so every chunk is aligned to its element size (safetensors allows no
// padding between tensors).
//
// index.json (version 2):
//   {"format": "dtensor-checkpoint", "version": 2, "save_id": "<unique to the save>",
//    "checksum": {"algorithm": A, "piece_bytes": P},   A: "xxh3_64" (or "xxh64", checksum.hpp)
//    "files": {"rank-00000.safetensors": {"bytes": size, "header": "<A of the file's first 8 + header bytes>"}, ...},
//    "tensors": {name: {"dtype": "float32", "shape": [...],
//                       "saved_placements": "[S(0), R]", "saved_mesh": [2, 2],
//                       "chunks": [{"offsets": [...], "sizes": [...], "file": ..., "key": name,
//                                   "byte_offset": absolute offset in the file, "byte_length": n,
//                                   A: ["16 hex digits", ... one per piece of P bytes]}]}},
//    "scalars": {name: {"type": "int", "value": 7} | {"type": "float", "value": 0.5, "bits": hex} |
//                      {"type": "string", "value": "..."}},
//    "metadata": {string: string}}
//
// Each data file's safetensors metadata holds "format", "rank", the "save_id" and,
// for each chunk, "box:<key>": its offsets in the tensor (io/safetensors.hpp).
//
// Trust. A loader reads a checkpoint as it would a stranger's (io/index.hpp,
// io/index_json.hpp, io/safetensors.hpp): the index's checksum is verified before a
// byte of it is parsed, so an edited index is refused like an edited data file; the
// index is parsed strictly within limits; every number is checked with overflow-
// checked arithmetic before it sizes or addresses memory; files are plain names
// opened inside the directory without following links, and only regular files; the
// data files must agree with the index on their header checksum, their save, and
// each chunk's key, dtype, shape, box and bytes. Version 1 indexes (no checksums of
// their own) load only with LoadOptions::allow_unverified_index.
//
// The chunks of a tensor tile it: every element lies in exactly one chunk. Blocks
// with no elements are not chunks (their offset would say nothing; PyTorch DCP's
// offset bugs with empty shards, pytorch#150862 and #108869, cannot arise), and a
// tensor of no elements has no chunks. Offsets come from each rank's exact block
// (ShardLayout), never from a chunk formula (pytorch#161368).
#include "dtensor/io/index.hpp"
#include "dtensor/io/index_json.hpp"
#include "dtensor/io/safetensors.hpp"
