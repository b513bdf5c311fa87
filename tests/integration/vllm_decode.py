#!/usr/bin/python3
"""vllm_decode.py -- decodes dumped KV event batches with msgspec structs
shaped as vLLM defines its events, as a router built on vLLM's own classes
would: the current definitions (maps, tagged by "type") for the map
encoding; for the array encoding, the older array-like definitions, both
the one without and the one with lora_name.  msgspec is the decoder vLLM
uses; where it is not installed this exits 77 (skip).

usage: vllm_decode.py FORMAT DUMP    (FORMAT: map | array; DUMP: a file of
       4-byte big-endian lengths, each followed by one batch's payload)
"""
import sys
from typing import Any, Optional, Union

try:
    import msgspec
except ImportError:
    print("SKIP: msgspec not installed (pip install msgspec)")
    sys.exit(77)

Hash = Union[bytes, int]


# -- the current shape: maps, omit_defaults, tagged by "type" ----------------
class Batch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: Optional[int] = None


class Event(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[Hash]
    parent_block_hash: Optional[Hash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[Any]]] = None
    group_idx: Optional[int] = None


class BlockRemoved(Event):
    block_hashes: list[Hash]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(Event):
    pass


class MapBatch(Batch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


# -- the older shapes: array_like -------------------------------------------
class ABatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: Optional[int] = None


class AEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class ABlockStored7(AEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class ABlockRemoved(AEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str]


class AAllBlocksCleared(AEvent, tag="AllBlocksCleared"):
    pass


class ABlockStored8(ABlockStored7, tag="BlockStored"):
    lora_name: Optional[str]


class ABatch7(ABatch):
    events: list[Union[ABlockStored7, ABlockRemoved, AAllBlocksCleared]]


class ABatch8(ABatch):
    events: list[Union[ABlockStored8, ABlockRemoved, AAllBlocksCleared]]


def payloads(path):
    data = open(path, "rb").read()
    i = 0
    while i < len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        yield data[i + 4:i + 4 + n]
        i += 4 + n


def main():
    fmt, path = sys.argv[1:3]
    kinds = {}
    decoders = ([msgspec.msgpack.Decoder(MapBatch)] if fmt == "map" else
                [msgspec.msgpack.Decoder(ABatch7), msgspec.msgpack.Decoder(ABatch8)])
    n = 0
    for p in payloads(path):
        for d in decoders:
            b = d.decode(p)  # raises on anything vLLM's structs refuse
            for ev in b.events:
                kinds[type(ev).__name__] = kinds.get(type(ev).__name__, 0) + 1
                if hasattr(ev, "block_size") and ev.block_size <= 0:
                    sys.exit(f"block_size {ev.block_size}")
        n += 1
    if n == 0:
        sys.exit("no batches in the dump")
    print(f"vllm_decode {fmt}: {n} batches decoded by {len(decoders)} definition(s): "
          + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))


main()
