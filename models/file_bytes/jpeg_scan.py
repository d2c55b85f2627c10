"""A baseline JPEG's entropy-coded scan, rows of MCUs at a time, in numpy (models/file_bytes/jpeg.py
makes the coefficients): the standard Huffman tables of ITU T.81 Annex K.3 (what libjpeg, and so
Blender's writer, uses unless asked to optimise them), every MCU row one restart interval, so a
band of rows is byte-aligned and starts with its DC predictions at zero, and is coded in one call
with no bit state carried over.

Vectorised: every symbol of the band becomes a (bits, length) pair at its place in the scan, the
lengths' running sum gives each one's bit offset, and the bytes are the sums of each symbol's
shifted bits (no two symbols share a bit, so a sum is their OR). Then the 0xFF bytes get their
stuffed 0x00 and the rows their RSTn markers."""

from __future__ import annotations

import numpy as np

# ITU T.81 Annex K.3: (code counts of lengths 1..16, symbols). The AC tables list their first
# symbols as Annex K does; the rest follow in ascending order there.
_DC_LUMINANCE = ((0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0), tuple(range(12)))
_DC_CHROMINANCE = ((0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0), tuple(range(12)))
_AC_LUMINANCE_FIRST = (
    0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21, 0x31, 0x41, 0x06, 0x13, 0x51, 0x61, 0x07, 0x22, 0x71,
    0x14, 0x32, 0x81, 0x91, 0xA1, 0x08, 0x23, 0x42, 0xB1, 0xC1, 0x15, 0x52, 0xD1, 0xF0, 0x24, 0x33, 0x62, 0x72,
    0x82,
)
_AC_CHROMINANCE_FIRST = (
    0x00, 0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0x07, 0x61, 0x71, 0x13, 0x22,
    0x32, 0x81, 0x08, 0x14, 0x42, 0x91, 0xA1, 0xB1, 0xC1, 0x09, 0x23, 0x33, 0x52, 0xF0, 0x15, 0x62, 0x72, 0xD1,
    0x0A, 0x16, 0x24, 0x34, 0xE1, 0x25, 0xF1,
)
EOB, ZRL = 0x00, 0xF0
RST0 = 0xD0


def _ac_symbols(first: tuple[int, ...]) -> tuple[int, ...]:
    every = [EOB, ZRL] + [(run << 4) | size for run in range(16) for size in range(1, 11)]
    return first + tuple(sorted(set(every) - set(first)))


_AC_LUMINANCE = ((0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7D), _ac_symbols(_AC_LUMINANCE_FIRST))
_AC_CHROMINANCE = ((0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 0x77), _ac_symbols(_AC_CHROMINANCE_FIRST))
# (class << 4 | table id, table) as the DHT segments name them: DC 0, AC 0 (luminance), DC 1, AC 1 (chrominance)
HUFFMAN_TABLES = ((0x00, _DC_LUMINANCE), (0x10, _AC_LUMINANCE), (0x01, _DC_CHROMINANCE), (0x11, _AC_CHROMINANCE))


def _codes(table) -> tuple[np.ndarray, np.ndarray]:
    """Canonical Huffman codes (T.81 Annex C): each symbol's code and its length."""
    counts, symbols = table
    codes, lengths = np.zeros(256, np.uint64), np.zeros(256, np.int64)
    code, index = 0, 0
    for length, count in enumerate(counts, start=1):
        for _ in range(count):
            codes[symbols[index]], lengths[symbols[index]] = code, length
            code, index = code + 1, index + 1
        code <<= 1
    return codes, lengths


def _by_table(luminance, chrominance) -> tuple[np.ndarray, np.ndarray]:
    """(2, 256) codes and lengths, indexed by table (0 luminance, 1 chrominance) and symbol."""
    (codes0, lengths0), (codes1, lengths1) = _codes(luminance), _codes(chrominance)
    return np.stack((codes0, codes1)), np.stack((lengths0, lengths1))


_DC_CODES, _DC_LENGTHS = _by_table(_DC_LUMINANCE, _DC_CHROMINANCE)
_AC_CODES, _AC_LENGTHS = _by_table(_AC_LUMINANCE, _AC_CHROMINANCE)
# bits of |v| (the symbol's "size"): 8-bit samples keep coefficients and DC differences under 2**12
_SIZE = np.zeros(1 << 16, np.int64)
for _bits in range(1, 17):
    _SIZE[1 << (_bits - 1) : 1 << _bits] = _bits


def _amplitude(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The bits after a symbol: v itself, or v - 1 in its ``sizes`` low bits when negative."""
    return (values - (values < 0)).astype(np.int64) & ((np.int64(1) << sizes) - 1)


def _exclusive_sum(counts: np.ndarray) -> np.ndarray:
    total = np.cumsum(counts)
    return total - counts


def scan_rows(blocks: np.ndarray, tables: np.ndarray, first_row: int, last_row: int) -> bytes:
    """The scan bytes of MCU rows ``first_row``.. of ``blocks`` ((rows, blocks a row, 64): quantised
    coefficients in zigzag order, each DC already the difference to the one before of its
    component in the row), ``tables`` the Huffman table of each block of a row (0 luminance, 1
    chrominance). Each row ends byte-aligned (padded with 1 bits) and, unless it is ``last_row``
    of the image, followed by its RSTn marker."""
    row_count, per_row, _ = blocks.shape
    flat = blocks.reshape(-1, 64)
    table = np.tile(tables, row_count)
    ac_rows, ac_columns = np.nonzero(flat[:, 1:])
    values, zrls, ac_symbols = _ac_runs(flat, ac_rows, ac_columns)
    # each block: its DC, per nonzero AC its ZRLs and its symbol, then EOB unless coefficient 63 is nonzero
    ac_in_block = np.bincount(ac_rows, minlength=len(flat))
    if zrls.any():
        ac_in_block += np.bincount(ac_rows, weights=zrls, minlength=len(flat)).astype(np.int64)
    last = np.zeros(len(flat), np.int64)
    ends = np.append(ac_rows[1:] != ac_rows[:-1], True) if len(ac_rows) else np.zeros(0, bool)
    last[ac_rows[ends]] = ac_columns[ends] + 1
    has_eob = last < 63
    counts = 1 + ac_in_block + has_eob
    block_row = np.repeat(np.arange(row_count), per_row)
    start = _exclusive_sum(counts) + block_row  # one padding symbol ends each row
    total = int(counts.sum()) + row_count
    bits, lengths = np.zeros(total, np.uint64), np.zeros(total, np.int64)

    dc = flat[:, 0]
    sizes = _SIZE[np.abs(dc)]
    bits[start] = (_DC_CODES[table, sizes] << sizes.astype(np.uint64)) | _amplitude(dc, sizes).astype(np.uint64)
    lengths[start] = _DC_LENGTHS[table, sizes] + sizes

    ac_table = table[ac_rows]
    steps = zrls + 1
    within = _exclusive_sum(steps) - _exclusive_sum(ac_in_block)[ac_rows]  # symbols before it in its block
    place = start[ac_rows] + 1 + within + zrls
    sizes = ac_symbols & 15
    symbol = ac_table * 256 + ac_symbols  # into the tables' flat (2 * 256) views
    bits[place] = (_AC_CODES.ravel().take(symbol) << sizes.astype(np.uint64)) | _amplitude(values, sizes).astype(np.uint64)
    lengths[place] = _AC_LENGTHS.ravel().take(symbol) + sizes
    if zrls.any():
        with_zrl = np.flatnonzero(zrls)
        repeated = np.repeat(with_zrl, zrls[with_zrl])
        nth = np.arange(len(repeated)) - np.repeat(_exclusive_sum(zrls[with_zrl]), zrls[with_zrl])
        at = start[ac_rows[repeated]] + 1 + within[repeated] + nth
        bits[at], lengths[at] = _AC_CODES[ac_table[repeated], ZRL], _AC_LENGTHS[ac_table[repeated], ZRL]
    eob_blocks = np.flatnonzero(has_eob)
    at = start[eob_blocks] + 1 + ac_in_block[eob_blocks]
    bits[at], lengths[at] = _AC_CODES[table[eob_blocks], EOB], _AC_LENGTHS[table[eob_blocks], EOB]

    row_ends = np.cumsum(counts.reshape(row_count, per_row).sum(axis=1) + 1)
    row_bits = np.add.reduceat(lengths, np.r_[0, row_ends[:-1]])  # the padding's length still 0
    padding = -row_bits % 8
    bits[row_ends - 1], lengths[row_ends - 1] = (np.uint64(1) << padding.astype(np.uint64)) - np.uint64(1), padding
    data = _packed(bits, lengths)
    return _with_markers(data, (row_bits + padding) // 8, first_row, last_row)


def _ac_runs(flat: np.ndarray, ac_rows: np.ndarray, ac_columns: np.ndarray):
    """Each nonzero AC coefficient's value, the ZRLs (16 zeros each) before it and its symbol
    (zeros left before it << 4 | its size)."""
    values = flat[ac_rows, ac_columns + 1]
    before = np.zeros_like(ac_columns)
    if len(ac_columns) > 1:
        same_block = ac_rows[1:] == ac_rows[:-1]
        before[1:] = np.where(same_block, ac_columns[:-1] + 1, 0)
    run = (ac_columns + 1) - before - 1
    sizes = _SIZE[np.abs(values)]
    return values, (run >> 4).astype(np.int64), ((run & 15) << 4 | sizes).astype(np.int64)


def _packed(bits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes of the symbols one after another, most significant bit first: each symbol's
    bits shifted to their place in a 64-bit word (the part past the word's end into the next),
    the words' parts summed (no two share a bit), the words written big-endian."""
    offsets = _exclusive_sum(lengths)
    byte_count = int(offsets[-1] + lengths[-1]) // 8
    word = offsets >> 6
    shift = 64 - (offsets & 63) - lengths  # below 0: the symbol runs -shift bits into the next word
    inside = np.where(shift >= 0, bits << np.maximum(shift, 0).astype(np.uint64), bits >> np.maximum(-shift, 0).astype(np.uint64))
    words = np.zeros(int(word[-1]) + 2, np.uint64)
    firsts = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
    words[word[firsts]] = np.add.reduceat(inside, firsts)
    spill = np.flatnonzero(shift < 0)  # at most one a word: the one across its start
    words[word[spill] + 1] += bits[spill] << (64 + shift[spill]).astype(np.uint64)
    return words.astype(">u8").view(np.uint8)[:byte_count]


def _with_markers(data: np.ndarray, row_bytes: np.ndarray, first_row: int, last_row: int) -> bytes:
    """``data`` with a 0x00 after each 0xFF and RSTn after each row but the image's last."""
    stuffed = np.flatnonzero(data == 0xFF) + 1
    ends = np.cumsum(row_bytes)
    rows = np.arange(first_row, first_row + len(row_bytes))
    marked = rows != last_row
    ends, rows = ends[marked], rows[marked]
    where = np.concatenate((stuffed, ends, ends))
    inserted = np.concatenate((np.zeros(len(stuffed), np.uint8), np.full(len(ends), 0xFF, np.uint8),
                               (RST0 + rows % 8).astype(np.uint8)))
    return np.insert(data, where, inserted).tobytes()  # equal places keep this order: 0x00, 0xFF, RSTn
