#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Tests for icrc_check.py against captures written here from the reference
vectors of shared/reference/roce.md section 7."""

import io
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "icrc_check.py")
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree

import icrc_check  # noqa: E402

# IP packets including the ICRC as sent (roce.md 7).
V4_SEND = bytes.fromhex(
    "45000034123440004011a481c0000201c0000202c12312b7002000000430ffff0000001180000064"
    "68656c6c6f000000c9bbd7a0"
)
V4_ACK = bytes.fromhex(
    "45000030123440004011a485c0000201c0000202c12312b7001c00001100ffff00000012000000641f00000173ea64c4"
)
V6_SEND = bytes.fromhex(
    "612abcde00201140fd000000000000000000000000000001fd000000000000000000000000000002"
    "c00112b7002012340410ffff00000022800000056162636465666700a6125167"
)
VECTORS = [V4_SEND, V4_ACK, V6_SEND]


def corrupted(pkt, index):
    b = bytearray(pkt)
    b[index] ^= 0x01
    return bytes(b)


def ethernet(ip, vlan=None, trailer=b""):
    ethertype = 0x86DD if ip[0] >> 4 == 6 else 0x0800
    hdr = bytes.fromhex("020000000002 020000000001")
    if vlan is not None:
        hdr += struct.pack("!HH", 0x8100, vlan)
    return hdr + struct.pack("!H", ethertype) + ip + trailer


def sll(ip):
    ethertype = 0x86DD if ip[0] >> 4 == 6 else 0x0800
    return struct.pack("!HHH8sH", 0, 772, 6, b"\0" * 8, ethertype) + ip


def sll2(ip):
    ethertype = 0x86DD if ip[0] >> 4 == 6 else 0x0800
    return struct.pack("!HHIHBB8s", ethertype, 0, 1, 772, 0, 6, b"\0" * 8) + ip


def null_loopback(ip, order="<"):
    family = 10 if ip[0] >> 4 == 6 else 2
    return struct.pack(order + "I", family) + ip


def pcap(linktype, frames, endian="<", nanosecond=False):
    magic = 0xA1B23C4D if nanosecond else 0xA1B2C3D4
    out = struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, 65535, linktype)
    for i, frame in enumerate(frames):
        out += struct.pack(endian + "IIII", i, 0, len(frame), len(frame)) + frame
    return out


def pcapng_block(btype, body, endian="<"):
    body += b"\0" * (-len(body) % 4)
    length = 12 + len(body)
    return struct.pack(endian + "II", btype, length) + body + struct.pack(endian + "I", length)


def pcapng(linktype, frames, endian="<", simple=False):
    shb = pcapng_block(0x0A0D0D0A, struct.pack(endian + "IHHq", 0x1A2B3C4D, 1, 0, -1), endian)
    idb = pcapng_block(1, struct.pack(endian + "HHI", linktype, 0, 0), endian)
    out = shb + idb
    for frame in frames:
        if simple:
            out += pcapng_block(3, struct.pack(endian + "I", len(frame)) + frame, endian)
        else:
            out += pcapng_block(6, struct.pack(endian + "IIIII", 0, 0, 0, len(frame), len(frame)) + frame, endian)
    return out


class icrc_check_test(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, data, name="cap"):
        path = os.path.join(self.dir.name, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def run_script(self, data, *args):
        path = self.write(data)
        return subprocess.run(
            [sys.executable, SCRIPT, path, *args], capture_output=True, text=True, check=False
        )

    def check(self, data, port=4791):
        out = io.StringIO()
        return icrc_check.check(self.write(data), port, out)

    # --- the script as a program ------------------------------------------

    def test_reference_vectors_pass_and_exit_zero(self):
        r = self.run_script(pcap(1, [ethernet(p) for p in VECTORS]))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.strip().splitlines()[-1], "checked 3 packets, 0 bad")

    def test_corrupted_packet_is_reported_and_exits_one(self):
        frames = [ethernet(p) for p in VECTORS] + [ethernet(corrupted(V4_SEND, 45))]
        r = self.run_script(pcapng(1, frames))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(lines[-1], "checked 4 packets, 1 bad")
        self.assertTrue(lines[0].startswith("frame 4: bad ICRC"), lines[0])

    def test_port_option_selects_the_destination_port(self):
        r = self.run_script(pcap(1, [ethernet(p) for p in VECTORS]), "--port", "14791")
        self.assertEqual(r.returncode, 0)
        self.assertEqual(r.stdout.strip(), "checked 0 packets, 0 bad")

    def test_unreadable_file_exits_two(self):
        r = self.run_script(b"not a capture at all")
        self.assertEqual(r.returncode, 2)

    # --- the ICRC itself --------------------------------------------------

    def test_variant_fields_are_masked(self):
        pkt = bytearray(V4_SEND)
        pkt[1] = 0x03  # ECN CE
        pkt[8] = 0x01  # TTL
        pkt[10:12] = b"\x12\x34"  # IP checksum
        pkt[26:28] = b"\xab\xcd"  # UDP checksum
        pkt[28 + 4] = 0xC0  # FECN, BECN
        v6 = bytearray(V6_SEND)
        v6[0:4] = b"\x6f\xff\xff\xff"  # traffic class and flow label
        v6[7] = 1  # hop limit
        self.assertEqual(self.check(pcap(1, [ethernet(bytes(pkt)), ethernet(bytes(v6))])), (2, 0))

    def test_ipv4_identification_is_covered(self):
        self.assertEqual(self.check(pcap(1, [ethernet(corrupted(V4_SEND, 5))])), (1, 1))

    def test_every_covered_byte_is_covered(self):
        masked = {1, 8, 10, 11, 26, 27, 28 + 4}
        # Flipping bit 0 of these makes the packet something else: IHL 4,
        # a fragment, protocol 16, another destination port.
        not_roce = {0, 6, 7, 9, 22, 23}
        covered = [i for i in range(len(V4_SEND) - 4) if i not in masked | not_roce]
        frames = [ethernet(corrupted(V4_SEND, i)) for i in covered]
        self.assertEqual(self.check(pcap(1, frames)), (len(covered), len(covered)))

    # --- capture formats and link types ----------------------------------

    def assert_all_good(self, data, n=3):
        self.assertEqual(self.check(data), (n, 0))

    def test_pcap_big_endian_and_nanosecond(self):
        frames = [ethernet(p) for p in VECTORS]
        self.assert_all_good(pcap(1, frames, endian=">"))
        self.assert_all_good(pcap(1, frames, nanosecond=True))
        self.assert_all_good(pcap(1, frames, endian=">", nanosecond=True))

    def test_pcapng_big_endian_and_simple_packet_blocks(self):
        frames = [ethernet(p) for p in VECTORS]
        self.assert_all_good(pcapng(1, frames, endian=">"))
        self.assert_all_good(pcapng(1, frames, simple=True))

    def test_ethernet_vlan_and_frame_padding(self):
        self.assert_all_good(pcap(1, [ethernet(p, vlan=5) for p in VECTORS]))
        # Short frames are padded (and may carry an FCS): the ICRC is found from the UDP length.
        self.assert_all_good(pcap(1, [ethernet(p, trailer=b"\0" * 10) for p in VECTORS]))

    def test_linux_cooked_sll_and_sll2(self):
        self.assert_all_good(pcap(113, [sll(p) for p in VECTORS]))
        self.assert_all_good(pcapng(276, [sll2(p) for p in VECTORS]))

    def test_raw_ip_link_types(self):
        self.assert_all_good(pcap(101, VECTORS))
        self.assert_all_good(pcap(228, [V4_SEND, V4_ACK]), n=2)
        self.assert_all_good(pcap(229, [V6_SEND]), n=1)

    def test_bsd_null_and_loop(self):
        self.assert_all_good(pcap(0, [null_loopback(p, "<") for p in VECTORS]))
        self.assert_all_good(pcap(0, [null_loopback(p, ">") for p in VECTORS]))
        self.assert_all_good(pcap(108, [null_loopback(p, ">") for p in VECTORS]))

    def test_non_roce_traffic_is_ignored(self):
        arp = bytes.fromhex("ffffffffffff020000000001 0806") + b"\0" * 28
        tcp = bytearray(V4_SEND)
        tcp[9] = 6
        other_port = bytearray(V4_SEND)
        other_port[22:24] = struct.pack("!H", 53)
        fragment = bytearray(V4_SEND)
        fragment[6:8] = b"\x20\x00"  # MF
        frames = [arp, ethernet(bytes(tcp)), ethernet(bytes(other_port)), ethernet(bytes(fragment))]
        self.assertEqual(self.check(pcap(1, frames + [ethernet(V4_ACK)])), (1, 0))

    def test_truncated_capture_counts_as_bad(self):
        frame = ethernet(V4_SEND)[:-6]  # as with a small snaplen
        self.assertEqual(self.check(pcap(1, [frame])), (1, 1))


if __name__ == "__main__":
    unittest.main()
