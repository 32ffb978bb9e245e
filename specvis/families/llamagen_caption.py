"""LlamaGen t2i's caption cleaning, the text preprocessing its flan-t5 captions were trained with.

FoundationVision/LlamaGen ``language/t5.py`` (from PixArt-alpha): ``T5Embedder.text_preprocessing``
applies ``clean_caption`` twice. This module implements the same rules, in the same order, as its own
code: what each step removes or replaces is listed in ``STEPS`` (the line numbers cite t5.py at commit
ce98ec4). Verified against the official function's outputs on 54 prompts (tests/fixtures/
llamagen_captions). Needs ftfy and beautifulsoup4 (``pip install specvis[hf]``).

One pass (``clean_once``):

1. percent-decoding with '+' as space (``urllib.parse.unquote_plus``), strip, lower case (l. 97-99);
2. ``STEPS``: URLs, HTML markup (BeautifulSoup's text), @nicknames, CJK, dashes, quotes, entities, IP
   addresses, ids, file names, punctuation runs (l. 100-167);
3. words joined by more than three '-' or '_' are split (l. 169-172);
4. ftfy's text fixes, HTML unescaped twice, stripped (``basic_clean``, l. 90-94, 174);
5. ``LATE_STEPS``: product codes, shop phrases, sizes like 1024x768, spacing after punctuation, white
   space, enclosing quotes and stray leading/trailing marks (l. 176-199).
"""

from __future__ import annotations

import html
import re
import urllib.parse
import warnings

URL_ENDINGS = "com|co|ru|net|org|edu|gov|it"
FILE_TYPES = "png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4"


def _url(scheme: str) -> str:
    """A scheme ('https?:' / 'www:') followed by slashes or a character, or a host name ending in one of
    URL_ENDINGS with an optional path, not followed by '@' (t5.py l. 102-107)."""
    return (rf"\b(?:{scheme}(?:/{{1,3}}|[a-zA-Z0-9%])"
            rf"|[a-zA-Z0-9.\-]+\.(?:{URL_ENDINGS})[\w/-]*\b/?(?!@))")


# (what it does, pattern, replacement), applied in order before the '-'/'_' split
STEPS = [
    ("the <person> tag becomes a word", r"<person>", "person"),
    ("http(s) URLs and bare host names are removed", _url("https?:"), ""),
    ("www: URLs and bare host names are removed", _url("www:"), ""),
    ("HTML markup is reduced to its text", None, None),
    ("@nicknames are removed", r"@\w+\b", ""),
    ("CJK strokes, Katakana extensions, enclosed CJK, CJK compatibility and unified ideographs "
     "(U+31C0..U+9FFF, the union of the seven official ranges) are removed", r"[\u31c0-\u9fff]+", ""),
    ("every kind of dash, a run of them, becomes '-'",
     r"[\u002d\u058a\u05be\u1400\u1806\u2010-\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u301c\u3030\u30a0"
     r"\ufe31\ufe32\ufe58\ufe63\uff0d]+", "-"),
    ("double-quote-like marks become '\"'", r"[\u0060\u00b4\u00ab\u00bb\u201c\u201d\u00a8]", '"'),
    ("curly single quotes become \"'\"", r"[\u2018\u2019]", "'"),
    ("'&quot' with or without ';' is removed", r"&quot;?", ""),
    ("'&amp' is removed", r"&amp", ""),
    ("IPv4-like addresses become a space", r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),
    ("an article id 'd:dd' at the end is removed", r"\d:\d\d\s+$", ""),
    ("a literal backslash-n becomes a space", r"\\n", " "),
    ("'#' and 1-3 digits is removed", r"#\d{1,3}\b", ""),
    ("'#' and 5 or more digits is removed", r"#\d{5,}\b", ""),
    ("numbers of 6 or more digits are removed", r"\b\d{6,}\b", ""),
    ("file names are removed", rf"\S+\.(?:{FILE_TYPES})", ""),
    ("a run of quotes becomes one '\"'", r"[\"']{2,}", '"'),
    ("a run of dots becomes a space", r"\.{2,}", " "),
    ("runs of # ® • © ™ & @ · º ½ ¾ ¿ ¡ § ~ brackets | \\ / * become a space",
     r"[#\u00ae\u2022\u00a9\u2122&@\u00b7\u00ba\u00bd\u00be\u00bf\u00a1\u00a7~()\[\]{}|\\/*]+", " "),
    ("a dot between spaces becomes a space", r"\s+\.\s+", " "),
]

LATE_STEPS = [
    ("codes of 1-3 letters and 3-15 digits are removed (jc6640)", r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),
    ("letters-digits-letters codes are removed (jc6640vc)", r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),
    ("digits-letters-digits codes are removed (6640vc231)", r"\b\d+[a-zA-Z]+\d+\b", ""),
    ("'[worldwide] [free] shipping' is removed", r"(?:worldwide\s+)?(?:free\s+)?shipping", ""),
    ("'[free] download [free]' is removed", r"(?:free\s)?download(?:\sfree)?", ""),
    ("'click for/on <word>' is removed", r"\bclick\b\s(?:for|on)\s\w+", ""),
    ("file-type words, with ' image(s)' after them, are removed", rf"\b(?:{FILE_TYPES})(?:\simages?)?", ""),
    ("'page <number>' is removed", r"\bpage\s+\d+\b", ""),
    ("mixed codes with two digit groups become a space (j2d1a2a)", r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),
    ("sizes like 1024x768, 3.5x2 (x, Cyrillic \u0445 or \u00d7) are removed",
     r"\b\d+\.?\d*[x\u0445\u00d7]\d+\.?\d*\b", ""),
    ("white space around ':' after a word becomes ': '", r"\b\s+:\s+", ": "),
    ("a non-digit and ',' '.' or '/' before a word gets a space after it", r"(\D[,./])\b", r"\1 "),
    ("white space runs become one space", r"\s+", " "),
    ("quotes enclosing the whole caption are removed", r"^[\"']([\w\W]+)[\"']$", r"\1"),
    ("a leading ' _ , - : ; is removed", r"^['_,\-:;]", ""),
    ("a trailing ' _ , - : + is removed", r"['_,\-:+]$", ""),
    ("a caption that is one dot-word (.hidden) is removed", r"^\.\S+$", ""),
]

_COMPILED = [(re.compile(p) if p else None, r) for _, p, r in STEPS]
_COMPILED_LATE = [(re.compile(p), r) for _, p, r in LATE_STEPS]
_JOINERS = re.compile(r"[-_]")


def _libraries():
    try:
        import ftfy
        from bs4 import BeautifulSoup, MarkupResemblesLocatorWarning
    except ImportError:
        raise ValueError("LlamaGen t2i text prompts need ftfy and beautifulsoup4 (the official caption "
                         "cleaning): pip install specvis[hf]") from None
    return ftfy, BeautifulSoup, MarkupResemblesLocatorWarning


def clean_once(text: str) -> str:
    """One pass of the official cleaning (module docstring)."""
    ftfy, soup, locator_warning = _libraries()
    text = urllib.parse.unquote_plus(str(text)).strip().lower()
    for pattern, repl in _COMPILED:
        if pattern is None:  # HTML: the text BeautifulSoup's html.parser finds
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", locator_warning)  # a URL- or file-like caption is still text
                text = soup(text, features="html.parser").text
        else:
            text = pattern.sub(repl, text)
    if len(_JOINERS.findall(text)) > 3:  # this-is-my-cute-cat / this_is_my_cute_cat
        text = _JOINERS.sub(" ", text)
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    for pattern, repl in _COMPILED_LATE:
        text = pattern.sub(repl, text)
    return text.strip()


def clean_caption(text: str) -> str:
    """The caption as LlamaGen's flan-t5 sees it: ``clean_once`` applied twice (t5.py l. 81-86)."""
    return clean_once(clean_once(text))
