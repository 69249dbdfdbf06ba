#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Independent RoCEv2 ICRC checker for packet captures.

Reads a pcap or pcapng file, finds the UDP packets sent to the RoCEv2 port
(4791 unless --port says otherwise), recomputes each one's ICRC with
zlib.crc32 and compares it with the 4 bytes at the end of the UDP payload.

The ICRC (IBTA vol. 1 annex A17.3.3, shared/reference/roce.md 1.6) is the
CRC-32 of 8 bytes of 0xFF (the LRH RoCEv2 lacks) followed by the IP header,
the UDP header and the transport packet up to the ICRC, with the fields that
routers may change set to all ones:
  IPv4: TOS (byte 1), TTL (byte 8), header checksum (bytes 10-11)
  IPv6: traffic class and flow label (low nibble of byte 0, bytes 1-3),
        hop limit (byte 7)
  UDP:  checksum (bytes 6-7)
  BTH:  byte 4 (FECN, BECN, reserved)
It is sent least-significant byte first.  The ICRC is located from the UDP
length, not the frame length (Ethernet pads short frames).

Link types: Ethernet (with VLAN tags), Linux cooked SLL and SLL2, raw IP,
IPv4, IPv6, BSD loopback (DLT_NULL / DLT_LOOP).  `tshark -i lo` on Linux
writes pcapng with Ethernet link type.

Prints one line per bad packet and a summary `checked N packets, M bad`;
exits 1 if any packet is bad, 2 if the file cannot be read.
"""

import argparse
import struct
import sys
import zlib

ROCE_PORT = 4791
BTH_SIZE = 12
ICRC_SIZE = 4

# Link types (https://www.tcpdump.org/linktypes.html).
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_RAW_ALT = (12, 14)  # DLT_RAW on some BSDs
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_IPV6 = 0x86DD
ETHERTYPE_VLAN = (0x8100, 0x88A8, 0x9100)


class CaptureError(Exception):
    pass


# --- capture files ----------------------------------------------------------


def read_pcap(data):
    """Yields (linktype, frame bytes, original length) from a pcap file."""
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise CaptureError("not a pcap file")
    if len(data) < 24:
        raise CaptureError("truncated pcap header")
    linktype = struct.unpack_from(endian + "I", data, 20)[0] & 0x0FFFFFFF
    off = 24
    while off + 16 <= len(data):
        _, _, caplen, origlen = struct.unpack_from(endian + "IIII", data, off)
        off += 16
        if off + caplen > len(data):
            raise CaptureError("truncated pcap record")
        yield linktype, data[off : off + caplen], origlen
        off += caplen


def read_pcapng(data):
    """Yields (linktype, frame bytes, original length) from a pcapng file."""
    endian = "<"
    linktypes = []
    off = 0
    while off + 12 <= len(data):
        if data[off : off + 4] == b"\x0a\x0d\x0d\x0a":  # section header: sets byte order
            bom = data[off + 8 : off + 12]
            if bom == b"\x4d\x3c\x2b\x1a":
                endian = "<"
            elif bom == b"\x1a\x2b\x3c\x4d":
                endian = ">"
            else:
                raise CaptureError("bad pcapng byte-order magic")
            linktypes = []
        btype, blen = struct.unpack_from(endian + "II", data, off)
        if blen < 12 or blen % 4 or off + blen > len(data):
            raise CaptureError(f"bad pcapng block at offset {off}")
        body = data[off + 8 : off + blen - 4]
        if btype == 1:  # interface description
            linktypes.append(struct.unpack_from(endian + "H", body, 0)[0])
        elif btype == 6:  # enhanced packet
            ifid, _, _, caplen, origlen = struct.unpack_from(endian + "IIIII", body, 0)
            if ifid >= len(linktypes) or 20 + caplen > len(body):
                raise CaptureError(f"bad enhanced packet block at offset {off}")
            yield linktypes[ifid], body[20 : 20 + caplen], origlen
        elif btype == 3:  # simple packet: interface 0, length from the block
            if not linktypes:
                raise CaptureError("simple packet block before any interface")
            origlen = struct.unpack_from(endian + "I", body, 0)[0]
            yield linktypes[0], body[4 : 4 + min(origlen, len(body) - 4)], origlen
        elif btype == 2:  # obsolete packet block
            ifid, _, _, _, caplen, origlen = struct.unpack_from(endian + "HHIIII", body, 0)
            if ifid >= len(linktypes) or 20 + caplen > len(body):
                raise CaptureError(f"bad packet block at offset {off}")
            yield linktypes[ifid], body[20 : 20 + caplen], origlen
        off += blen


def read_capture(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] == b"\x0a\x0d\x0d\x0a":
        return read_pcapng(data)
    return read_pcap(data)


# --- link and network layers ------------------------------------------------


def ip_packet(linktype, frame):
    """Returns the IP packet inside a frame, or None if it carries none."""
    if linktype == LINKTYPE_ETHERNET:
        off = 12
        if len(frame) < off + 2:
            return None
        ethertype = struct.unpack_from("!H", frame, off)[0]
        while ethertype in ETHERTYPE_VLAN and len(frame) >= off + 6:
            off += 4
            ethertype = struct.unpack_from("!H", frame, off)[0]
        off += 2
    elif linktype == LINKTYPE_LINUX_SLL:
        if len(frame) < 16:
            return None
        ethertype, off = struct.unpack_from("!H", frame, 14)[0], 16
    elif linktype == LINKTYPE_LINUX_SLL2:
        if len(frame) < 20:
            return None
        ethertype, off = struct.unpack_from("!H", frame, 0)[0], 20
    elif linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        if len(frame) < 4:
            return None
        # DLT_NULL stores the family in the capturing host's byte order,
        # DLT_LOOP in network order; AF_INET is 2 everywhere, AF_INET6 24/28/30.
        fam_le, fam_be = struct.unpack_from("<I", frame, 0)[0], struct.unpack_from(">I", frame, 0)[0]
        fam = fam_be if linktype == LINKTYPE_LOOP else (fam_le if fam_le < 256 else fam_be)
        if fam == 2:
            ethertype = ETHERTYPE_IPV4
        elif fam in (10, 24, 28, 30):
            ethertype = ETHERTYPE_IPV6
        else:
            return None
        off = 4
    elif linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6) or linktype in LINKTYPE_RAW_ALT:
        if not frame:
            return None
        version = frame[0] >> 4
        ethertype = {4: ETHERTYPE_IPV4, 6: ETHERTYPE_IPV6}.get(version)
        off = 0
    else:
        return None
    if ethertype not in (ETHERTYPE_IPV4, ETHERTYPE_IPV6):
        return None
    return frame[off:]


def roce_parts(ip, port):
    """Splits a RoCEv2 packet into (masked IP+UDP header, transport bytes
    with ICRC, problem); returns None if it is not UDP to `port`.  `problem`
    is a string when the packet is too short to check."""
    if len(ip) < 1:
        return None
    version = ip[0] >> 4
    if version == 4:
        if len(ip) < 20:
            return None
        ihl = (ip[0] & 0x0F) * 4
        if ihl < 20 or ip[9] != 17:
            return None
        flags_frag = struct.unpack_from("!H", ip, 6)[0]
        if flags_frag & 0x3FFF:  # MF or a fragment offset: not a whole datagram
            return None
        udp = ihl
        hdr = bytearray(ip[: min(len(ip), udp + 8)])
        for i in (1, 8, 10, 11):
            hdr[i] = 0xFF
    elif version == 6:
        if len(ip) < 40 or ip[6] != 17:  # extension headers are not followed
            return None
        udp = 40
        hdr = bytearray(ip[: min(len(ip), udp + 8)])
        hdr[0] |= 0x0F
        for i in (1, 2, 3, 7):
            hdr[i] = 0xFF
    else:
        return None
    if len(ip) < udp + 8:
        return None
    dport = struct.unpack_from("!H", ip, udp + 2)[0]
    if dport != port:
        return None
    hdr[udp + 6] = hdr[udp + 7] = 0xFF
    udp_len = struct.unpack_from("!H", ip, udp + 4)[0]
    if udp_len < 8 + BTH_SIZE + ICRC_SIZE:
        return bytes(hdr), b"", f"UDP length {udp_len} too short for BTH and ICRC"
    if len(ip) < udp + udp_len:
        return bytes(hdr), b"", f"captured {len(ip) - udp} of {udp_len} UDP bytes"
    return bytes(hdr), bytes(ip[udp + 8 : udp + udp_len]), None


def icrc_of(masked_ip_udp, transport_without_icrc):
    bth = bytearray(transport_without_icrc[:BTH_SIZE])
    bth[4] = 0xFF
    crc = zlib.crc32(b"\xff" * 8)
    crc = zlib.crc32(masked_ip_udp, crc)
    crc = zlib.crc32(bytes(bth), crc)
    crc = zlib.crc32(transport_without_icrc[BTH_SIZE:], crc)
    return crc & 0xFFFFFFFF


def check(path, port, out=sys.stdout):
    """Checks every RoCEv2 packet of a capture; returns (checked, bad)."""
    checked = bad = 0
    for number, (linktype, frame, _) in enumerate(read_capture(path), start=1):
        ip = ip_packet(linktype, frame)
        if ip is None:
            continue
        parts = roce_parts(ip, port)
        if parts is None:
            continue
        checked += 1
        hdr, transport, problem = parts
        if problem is not None:
            bad += 1
            print(f"frame {number}: {problem}", file=out)
            continue
        wire = struct.unpack("<I", transport[-ICRC_SIZE:])[0]
        computed = icrc_of(hdr, transport[:-ICRC_SIZE])
        if wire != computed:
            bad += 1
            print(
                f"frame {number}: bad ICRC: opcode 0x{transport[0]:02x}, "
                f"wire 0x{wire:08x}, computed 0x{computed:08x}",
                file=out,
            )
    return checked, bad


def main(argv=None):
    parser = argparse.ArgumentParser(description="Verify the RoCEv2 ICRC of every packet in a capture.")
    parser.add_argument("capture", help="pcap or pcapng file")
    parser.add_argument("--port", type=int, default=ROCE_PORT, help="UDP destination port (default 4791)")
    args = parser.parse_args(argv)
    try:
        checked, bad = check(args.capture, args.port)
    except (OSError, CaptureError, struct.error) as e:
        print(f"icrc_check: {args.capture}: {e}", file=sys.stderr)
        return 2
    print(f"checked {checked} packets, {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
