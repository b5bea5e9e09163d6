#!/usr/bin/env python3
"""Writes the test inputs of tests/data that are binary or regular enough to generate.

    python3 tests/data/generate.py

- idx/: tiny valid IDX files, raw and gzip'd (seeds of the IDX fuzzer, companions of bad files);
- bad/dataset/: damaged IDX files and gzip streams;
- bad/config/: the configs that are not plain text (invalid UTF-8, byte order marks, NUL bytes)
  or are too regular to write by hand (deep nesting);
- bad/set/: the overrides that are not UTF-8.
- checkpoint/valid-f16.safetensors: checkpoint/valid.safetensors with every F32 tensor stored as F16
  (rounded to nearest even), a float16 seed of the checkpoint fuzzer;
- bad/checkpoint/: damaged copies of checkpoint/valid.safetensors (a small MLP's weights and
  momentum written by `tessera train`; the seed of the checkpoint fuzzer) and of valid-f16.

The hand-written bad configs and overrides live beside these; bad/expected.json gives the
expected error of every file. The output is deterministic (gzip'd with mtime 0), so running
the script again changes nothing unless the script changed.
"""

import gzip
import json
import pathlib
import struct

DATA = pathlib.Path(__file__).resolve().parent
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801


def idx(magic, dims, payload=b""):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload


def images(count, rows, cols):
    """An image file whose pixel i of image n is (7 i + n) % 256."""
    pixels = bytes((7 * i + n) % 256 for n in range(count) for i in range(rows * cols))
    return idx(IMAGES_MAGIC, [count, rows, cols], pixels)


def labels(values):
    return idx(LABELS_MAGIC, [len(values)], bytes(values))


def gz(data):
    return gzip.compress(data, compresslevel=9, mtime=0)


def write(relative, data):
    path = DATA / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def valid_idx():
    write("idx/tiny-images-idx3-ubyte", images(3, 5, 4))
    write("idx/tiny-labels-idx1-ubyte", labels([7, 0, 9]))
    write("idx/tiny-images-idx3-ubyte.gz", gz(images(3, 5, 4)))
    write("idx/tiny-labels-idx1-ubyte.gz", gz(labels([7, 0, 9])))
    write("idx/mnist-shape-images-idx3-ubyte.gz", gz(images(2, 28, 28)))
    write("idx/mnist-shape-labels-idx1-ubyte", labels([3, 1]))


def bad_datasets():
    good = images(3, 5, 4)
    good_gz = gz(good)
    files = {
        # Headers.
        "empty": b"",
        "short-magic": b"\x00\x00\x08",
        "wrong-magic": idx(0x12345678, [1, 1, 1], b"\x00"),
        "text-file": b"P5 28 28 255\n" + bytes(16),
        "signed-byte-data": idx(0x00000903, [1, 2, 2], bytes(4)),
        "float32-data": idx(0x00000D03, [1, 1, 1], bytes(4)),
        "unknown-data-type": idx(0x00000703, [1, 1, 1], bytes(1)),
        "labels-read-as-images": labels([1, 2]),
        "four-dimensions": idx(0x00000804, [1, 1, 1, 1], bytes(1)),
        "images-read-as-labels": good,
        "truncated-header": good[:10],
        "magic-only": struct.pack(">I", IMAGES_MAGIC),
        "zero-count": idx(IMAGES_MAGIC, [0, 28, 28]),
        "zero-rows": idx(IMAGES_MAGIC, [5, 0, 28]),
        "zero-cols": idx(IMAGES_MAGIC, [5, 28, 0]),
        "zero-labels": idx(LABELS_MAGIC, [0]),
        # Sizes: a product that overflows 64 bits, one of exactly 2^63 (beyond int64), one
        # over the 1 GiB limit, and a header that claims far more than the file holds.
        "dims-overflow-uint64": idx(IMAGES_MAGIC, [0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF]),
        "dims-overflow-int64": idx(IMAGES_MAGIC, [0x80000000, 0x80000000, 2]),
        "dims-over-byte-limit": idx(IMAGES_MAGIC, [0x10000, 0x1000, 0x1000]),
        "labels-over-byte-limit": idx(LABELS_MAGIC, [0xFFFFFFFF]),
        "header-claims-more": idx(IMAGES_MAGIC, [60000, 28, 28], bytes(100)),
        # Data.
        "truncated-data": good[:-5],
        "trailing-bytes": good + b"\x00",
        "label-out-of-range": labels([1, 10, 2]),
        "label-255": labels([255]),
        "truncated-labels": labels([1, 2, 3, 4])[:-2],
        # gzip streams.
        "gz-header-only": good_gz[:5],
        "gz-truncated": good_gz[:-4],
        "gz-truncated-mid-stream": good_gz[: len(good_gz) // 2],
        "gz-bad-crc": good_gz[:-8] + bytes([good_gz[-8] ^ 0xFF]) + good_gz[-7:],
        "gz-bad-length": good_gz[:-4] + bytes([good_gz[-4] ^ 0x01]) + good_gz[-3:],
        "gz-corrupt-data": good_gz[:12] + bytes(b ^ 0x5A for b in good_gz[12:24]) + good_gz[24:],
        "gz-trailing-garbage": good_gz + b"xy",
        "gz-wrong-magic-inside": gz(idx(0x12345678, [1, 1, 1], b"\x00")),
        "gz-truncated-idx-inside": gz(good[:-5]),
        "gz-over-byte-limit-inside": gz(idx(IMAGES_MAGIC, [0x10000, 0x1000, 0x1000])),
        "gz-label-out-of-range-inside": gz(labels([0, 11])),
        # A pair: 3 images (idx/tiny-images-idx3-ubyte) but 2 labels.
        "count-mismatch-labels": labels([1, 2]),
    }
    for name, data in files.items():
        write(f"bad/dataset/{name}", data)


def bad_configs():
    bom = b"\xef\xbb\xbf"
    files = {
        # Invalid UTF-8: a stray continuation byte, a truncated sequence, an overlong "/",
        # an encoded surrogate, a byte that never occurs in UTF-8, in values and in keys.
        "invalid-utf8-in-string.json": b'{"data": {"path": "fashion\x80mnist"}}',
        "invalid-utf8-truncated-sequence.json": b'{"data": {"path": "\xe2\x82"}}',
        "invalid-utf8-overlong.json": b'{"data": {"path": "\xc0\xaf"}}',
        "invalid-utf8-surrogate.json": b'{"data": {"path": "\xed\xa0\x80"}}',
        "invalid-utf8-in-key.json": b'{"data": {"pa\xfeth": "x"}}',
        "invalid-utf8-outside-strings.json": b'{"data": \xff}',
        "latin1-text.json": b'{"output": {"checkpoint": "r\xe9sum\xe9.safetensors"}}',
        # Byte order marks: UTF-8's is skipped (RFC 8259 allows it), so the document behind it
        # is read and its error found; UTF-16's is not JSON text at all; neither is a second one.
        "utf8-bom-then-wrong-type.json": bom + b'{"data": {"epochs": "3"}}',
        "utf8-bom-only.json": bom,
        "utf8-bom-twice.json": bom + bom + b"{}",
        "utf16le-bom.json": b"\xff\xfe" + "{}".encode("utf-16-le"),
        "utf16be-bom.json": b"\xfe\xff" + "{}".encode("utf-16-be"),
        # NUL bytes: a JSON parser may take one for the end of its input and never read on.
        "nul-after-document.json": b"{}\x00",
        "nul-then-second-document.json": b'{"data": {"epochs": 2}}\x00{"data": {"epochs": "x"}}',
        "nul-inside-document.json": b'{"data": \x00{"epochs": 2}}',
        "nul-only.json": b"\x00",
        "nul-in-string.json": b'{"data": {"path": "a\x00b"}}',
        # Nesting: far beyond the limit of 64, and one level beyond it in objects.
        "nested-arrays-10000.json": b"[" * 10000 + b"]" * 10000,
        "nested-objects-10000.json": b'{"a":' * 10000 + b"1" + b"}" * 10000,
        "nested-objects-65.json": b'{"a":' * 65 + b"1" + b"}" * 65,
        "nested-unclosed-10000.json": b'{"model": ' + b"[" * 10000,
    }
    for name, data in files.items():
        write(f"bad/config/{name}", data)


def bad_overrides():
    files = {
        # A value that is not JSON is kept as a string, so its bytes must be checked apart
        # from the JSON parser (found by the overrides fuzz target).
        "value-invalid-utf8.txt": b"/data/path=some\xeefolder\n",
        "path-invalid-utf8.txt": b'/sessionOptions/tensorLocationSettingsOverride/W\xff={"storage": "OffChip"}\n',
        "value-overlong-utf8.txt": b"/output/trace=\xc0\xaf.json\n",
    }
    for name, data in files.items():
        write(f"bad/set/{name}", data)


def split_checkpoint(data):
    """(header dict, data bytes) of a safetensors file."""
    length = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def join_checkpoint(header, payload, pad=True):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + payload


def as_f16(data):
    """The checkpoint `data` with its F32 tensors stored as F16, in the same order."""
    header, payload = split_checkpoint(data)
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    out = b""
    for name in names:
        entry = header[name]
        begin, end = entry["data_offsets"]
        chunk = payload[begin:end]
        if entry["dtype"] == "F32":
            values = struct.unpack(f"<{len(chunk) // 4}f", chunk)
            chunk = struct.pack(f"<{len(values)}e", *values)
            entry["dtype"] = "F16"
        entry["data_offsets"] = [len(out), len(out) + len(chunk)]
        out += chunk
    return join_checkpoint(header, out)


def valid_f16_checkpoint():
    write("checkpoint/valid-f16.safetensors", as_f16((DATA / "checkpoint" / "valid.safetensors").read_bytes()))


def bad_checkpoints():
    valid = (DATA / "checkpoint" / "valid.safetensors").read_bytes()
    header, payload = split_checkpoint(valid)
    f16 = (DATA / "checkpoint" / "valid-f16.safetensors").read_bytes()
    f16_header, f16_payload = split_checkpoint(f16)

    def f16_changed(edit, data=None):
        h = json.loads(json.dumps(f16_header))
        edit(h)
        return join_checkpoint(h, f16_payload if data is None else data)

    def f16_odd(h):
        last = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        h[last]["data_offsets"][1] -= 1

    def changed(edit):
        h = json.loads(json.dumps(header))
        edit(h)
        return join_checkpoint(h, payload)

    def meta(key, value):
        def edit(h):
            if value is None:
                del h["__metadata__"][key]
            else:
                h["__metadata__"][key] = value
        return changed(edit)

    def tensor(name, key, value):
        def edit(h):
            h[name][key] = value
        return changed(edit)

    w0_end = header["W0"]["data_offsets"][1]
    files = {
        "empty.safetensors": b"",
        "seven-bytes.safetensors": valid[:7],
        "header-truncated.safetensors": valid[:100],
        "data-truncated.safetensors": valid[:-1],
        "extra-data-at-end.safetensors": valid + b"\0\0\0\0",
        "header-length-past-end.safetensors": struct.pack("<Q", len(valid)) + valid[8:],
        "header-length-huge.safetensors": struct.pack("<Q", 2**63 - 1) + valid[8:],
        "header-not-json.safetensors": join_checkpoint({}, b"")[:8] + b"not json",
        "header-json-array.safetensors": join_checkpoint([], payload),
        "header-invalid-utf8.safetensors": struct.pack("<Q", 8) + b'{"\xff":1}' [:8] + payload,
        "no-metadata.safetensors": changed(lambda h: h.pop("__metadata__")),
        "not-tessera.safetensors": meta("format", "something.else"),
        "format-version-newer.safetensors": meta("formatVersion", "999"),
        "format-version-not-a-number.safetensors": meta("formatVersion", "one"),
        "step-missing.safetensors": meta("step", None),
        "step-negative.safetensors": meta("step", "-4"),
        "step-overflow.safetensors": meta("step", "99999999999999999999999"),
        "optimizer-not-json.safetensors": meta("optimizer", "{sgd"),
        "tensors-metadata-missing.safetensors": meta("tensors", None),
        "dtype-f64.safetensors": tensor("W0", "dtype", "F64"),
        "dtype-not-a-string.safetensors": tensor("W0", "dtype", 32),
        "shape-negative.safetensors": tensor("b0", "shape", [-1]),
        "shape-overflow.safetensors": tensor("W0", "shape", [2**62, 2**62]),
        "shape-disagrees-with-bytes.safetensors": tensor("W0", "shape", [784, 2]),
        "offsets-past-end.safetensors": tensor("b1", "data_offsets", [len(payload) - 4, len(payload) + 36]),
        "offsets-reversed.safetensors": tensor("W0", "data_offsets", [w0_end, 0]),
        "offsets-overlap.safetensors": tensor("b0", "data_offsets", [0, 4]),
        "offsets-missing.safetensors": changed(lambda h: h["W0"].pop("data_offsets")),
        "tensor-not-an-object.safetensors": changed(lambda h: h.__setitem__("W0", [1, 2])),
        "unknown-tensor-key.safetensors": tensor("W0", "layout", "rows"),
        # F16 payloads: F32 bytes labelled F16, an odd byte count, data cut short.
        "f16-label-on-f32-bytes.safetensors": tensor("W0", "dtype", "F16"),
        "f16-odd-byte-count.safetensors": f16_changed(f16_odd, f16_payload[:-1]),
        "f16-data-truncated.safetensors": f16[:-1],
        "f16-shape-disagrees-with-bytes.safetensors": f16_changed(lambda h: h["W0"].__setitem__("shape", [784, 2])),
    }
    for name, data in files.items():
        write(f"bad/checkpoint/{name}", data)


if __name__ == "__main__":
    valid_idx()
    bad_datasets()
    bad_configs()
    bad_overrides()
    valid_f16_checkpoint()
    bad_checkpoints()
