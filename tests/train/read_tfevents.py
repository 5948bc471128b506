#!/usr/bin/python3
"""Independent reader of TensorBoard event files (standard library only).

read_tfevents.py FILE TAG=MIN_COUNT...  verifies every TFRecord's length and data CRCs
(masked CRC32C), decodes the Event protos (wall_time, step, file_version, summary scalar
values), prints the tags with their counts and last values, and fails if a required tag
has fewer than MIN_COUNT values or if the first event is not the file_version record.
"""
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v = buf[i:i + 8]
            i += 8
        elif wire == 5:
            v = buf[i:i + 4]
            i += 4
        elif wire == 2:
            n, i = varint(buf, i)
            v = buf[i:i + n]
            i += n
        else:
            raise ValueError("unsupported wire type %d" % wire)
        yield num, wire, v


def read(path):
    data = open(path, "rb").read()
    i, events = 0, []
    while i < len(data):
        if i + 12 > len(data):
            raise ValueError("%s: truncated record header at byte %d" % (path, i))
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[i + 8:i + 12])
        if masked(header) != len_crc:
            raise ValueError("%s: length CRC mismatch at byte %d" % (path, i))
        body = data[i + 12:i + 12 + length]
        (body_crc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        if masked(body) != body_crc:
            raise ValueError("%s: data CRC mismatch at byte %d" % (path, i))
        i += 16 + length
        ev = {"scalars": []}
        for num, wire, v in fields(body):
            if num == 1 and wire == 1:
                ev["wall_time"] = struct.unpack("<d", v)[0]
            elif num == 2 and wire == 0:
                ev["step"] = v
            elif num == 3 and wire == 2:
                ev["file_version"] = v.decode()
            elif num == 5 and wire == 2:
                for snum, swire, sv in fields(v):
                    if snum == 1 and swire == 2:
                        tag, val = None, None
                        for vnum, vwire, vv in fields(sv):
                            if vnum == 1:
                                tag = vv.decode()
                            elif vnum == 2 and vwire == 5:
                                val = struct.unpack("<f", vv)[0]
                        ev["scalars"].append((tag, val))
        events.append(ev)
    return events


def main():
    path, wants = sys.argv[1], sys.argv[2:]
    events = read(path)
    if not events or events[0].get("file_version") != "brain.Event:2":
        print("first event is not file_version brain.Event:2")
        return 1
    counts, last = {}, {}
    for ev in events:
        for tag, val in ev["scalars"]:
            counts[tag] = counts.get(tag, 0) + 1
            last[tag] = (ev.get("step"), val)
    for tag in sorted(counts):
        print("%-24s %4d values, last step %s = %.6g" % (tag, counts[tag], last[tag][0], last[tag][1]))
    for w in wants:
        tag, need = w.split("=")
        if counts.get(tag, 0) < int(need):
            print("tag %s: %d values, need %s" % (tag, counts.get(tag, 0), need))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
