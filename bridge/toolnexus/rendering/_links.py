"""What an authorization URL really points at, and why a person should look twice.

Nothing here resolves or fetches anything: the URL is only taken apart. The
"domain" is the host's last two labels (three under a two-part public suffix such
as ``co.uk``), an approximation of the registrable domain that needs no list.

    >>> check_link("https://github.com.login.example/oauth").warnings[0]
    'The address starts with github.com, but the site is login.example.'
"""

from __future__ import annotations

import contextlib
import ipaddress
import unicodedata
from dataclasses import dataclass
from urllib.parse import urlsplit

KNOWN_DOMAINS = (
    "google.com",
    "github.com",
    "gitlab.com",
    "microsoft.com",
    "microsoftonline.com",
    "live.com",
    "apple.com",
    "amazon.com",
    "paypal.com",
    "facebook.com",
    "slack.com",
    "okta.com",
    "atlassian.com",
    "stripe.com",
)
"""Sites people sign in to often, so often imitated: a host that looks like one of
these, but is not it, gets a warning. ``toolnexus worker web --known-domain`` adds more."""

_TWO_PART_SUFFIXES = frozenset(
    f"{second}.{cc}"
    for cc in ("uk", "au", "nz", "jp", "br", "in", "za", "mx", "cn", "kr", "il", "tr")
    for second in ("co", "com", "org", "net", "ac", "gov", "edu", "ne", "or")
)

# Letters of other scripts drawn like Latin ones, and Latin sequences drawn like
# other Latin letters: enough of Unicode's confusables (UTS #39) for host names.
_CONFUSABLE = str.maketrans(
    {
        **dict.fromkeys("аạąàáâãäåɑα", "a"),
        **dict.fromkeys("ЬЪь", "b"),
        **dict.fromkeys("сϲċ", "c"),
        **dict.fromkeys("ԁɗ", "d"),
        **dict.fromkeys("еёẹęèéêëε", "e"),
        **dict.fromkeys("ɡց", "g"),
        **dict.fromkeys("һ", "h"),
        **dict.fromkeys("іїíìîïıɩι1|ӏ", "l"),
        **dict.fromkeys("јʝ", "j"),
        **dict.fromkeys("κк", "k"),
        **dict.fromkeys("ոп", "n"),
        **dict.fromkeys("оοσөọòóôõö0", "o"),
        **dict.fromkeys("рρ", "p"),
        **dict.fromkeys("ԛ", "q"),
        **dict.fromkeys("ѕ", "s"),
        **dict.fromkeys("τт", "t"),
        **dict.fromkeys("υսü", "u"),
        **dict.fromkeys("νѵ", "v"),
        **dict.fromkeys("ԝѡω", "w"),
        **dict.fromkeys("хχ", "x"),
        **dict.fromkeys("уүý", "y"),
        **dict.fromkeys("ᴢ", "z"),
        "i": "l",
    }
)
_CONFUSABLE_PAIRS = (("rn", "m"), ("vv", "w"), ("cl", "d"))
# Scripts that legitimately share a label (Japanese and Korean writing, with Latin).
_SCRIPT_MIXES = (
    frozenset({"LATIN", "CJK", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "CJK", "HANGUL"}),
)


@dataclass(frozen=True)
class Link:
    """An authorization URL taken apart for showing: ``before + host + after == url``.

    ``domain`` is the tail of ``host`` to highlight (``host`` ends with it). ``openable``
    is false for anything but an http(s) URL with a host: such a URL is shown as text,
    never as a link.
    """

    url: str
    before: str
    host: str
    after: str
    domain: str
    unicode_host: str
    other_form: str
    """The host written the other way (punycode for a Unicode name, Unicode for
    punycode), if that differs: what the person should compare."""
    openable: bool
    warnings: tuple[str, ...]

    @property
    def host_prefix(self) -> str:
        """The part of ``host`` in front of ``domain`` (subdomains), shown plainly."""
        return self.host[: len(self.host) - len(self.domain)]


def check_link(url: str, known_domains: tuple[str, ...] = KNOWN_DOMAINS) -> Link:
    """Take ``url`` apart and list what a person should be warned about.

    Warnings (sentences): not https; not a web address at all; no host; a user name
    before ``@`` that looks like a site; a bare IP address; punycode; letters of
    several scripts in one label; a host that looks like a ``known_domains`` entry,
    or like plain Latin letters, without being it; a known domain at the start of a
    host on another domain.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    netloc_at = url.find("//") + 2 if parts.netloc else -1
    raw_host = _host_of(parts.netloc)
    if netloc_at < 2 or not raw_host:
        problem = (
            f"This is not a web address ({scheme or 'no scheme'}): it is shown, not linked."
            if scheme not in ("http", "https")
            else "This address names no site: it is shown, not linked."
        )
        return Link(url, url, "", "", "", "", "", False, (problem,))
    start = netloc_at + parts.netloc.index(raw_host)
    before, after = url[:start], url[start + len(raw_host) :]
    if raw_host.endswith("."):  # the root label: shown, not part of the name
        raw_host, after = raw_host[:-1], "." + after
    host = unicodedata.normalize("NFKC", raw_host).lower()  # as browsers map it (UTS #46)
    unicode_host = _unicode(host)
    domain = host if _is_ip(host) else _domain(host)
    warnings: list[str] = []
    if scheme == "http":
        warnings.append(
            "This link is not https: the connection is not encrypted, "
            "and what you type there can be read or changed on the way."
        )
    elif scheme != "https":
        warnings.append(f"This is not a web address ({scheme}): it is shown, not linked.")
    if "@" in parts.netloc:
        user = parts.netloc.rsplit("@", 1)[0]
        warnings.append(
            f"The part before “@” ({user}) is not the site: this link goes to {unicode_host}."
        )
    if _is_ip(host):
        warnings.append("This link goes to a bare IP address, not to a named site.")
    else:
        warnings += _name_warnings(host, unicode_host, domain, known_domains)
    return Link(
        url=url,
        before=before,
        host=raw_host,
        after=after,
        domain=raw_host[len(raw_host) - len(domain) :],
        unicode_host=unicode_host,
        other_form=_other_form(host, unicode_host),
        openable=scheme in ("http", "https"),
        warnings=tuple(warnings),
    )


def _name_warnings(
    host: str, unicode_host: str, domain: str, known_domains: tuple[str, ...]
) -> list[str]:
    warnings: list[str] = []
    if any(label.startswith("xn--") for label in host.split(".")):
        warnings.append(
            f"The domain is written in punycode ({host}); it displays as “{unicode_host}”, "
            "which may imitate another name."
        )
    for label in unicode_host.split("."):
        scripts = _scripts(label)
        if len(scripts) > 1 and not any(scripts <= mix for mix in _SCRIPT_MIXES):
            names = " and ".join(sorted(s.title() for s in scripts))
            warnings.append(
                f"The domain mixes {names} letters (“{label}”), "
                "a common trick to imitate another name."
            )
            break
    skeleton = _skeleton(unicode_host)
    unicode_domain = _unicode(domain)
    written = domain if domain != unicode_domain else _other_form(domain, domain) or domain
    for known in known_domains:
        known = known.lower()
        if unicode_host == known or unicode_host.endswith("." + known):
            return warnings
        if _skeleton(unicode_domain) == _skeleton(known):
            warnings.append(f"The domain looks like {known} but is not it: it is {written}.")
            return warnings
        if unicode_host.startswith(known + "."):
            warnings.append(f"The address starts with {known}, but the site is {unicode_domain}.")
            return warnings
    if not unicode_host.isascii() and skeleton.isascii():
        warnings.append(
            f"The domain is drawn with letters that look like “{skeleton}” but are not: "
            f"it is {_other_form(host, unicode_host) or host}."
        )
    return warnings


def _other_form(host: str, unicode_host: str) -> str:
    if unicode_host != host:
        return unicode_host
    if host.isascii():
        return ""
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return ""


def _host_of(netloc: str) -> str:
    hostport = netloc.rsplit("@", 1)[-1]
    if hostport.startswith("["):
        return hostport[: hostport.find("]") + 1] if "]" in hostport else hostport
    return hostport.split(":", 1)[0]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _unicode(host: str) -> str:
    labels = []
    for label in host.split("."):
        if label.startswith("xn--"):
            with contextlib.suppress(UnicodeError):  # not valid punycode: shown as written
                label = label.encode("ascii").decode("idna")
        labels.append(label)
    return ".".join(labels)


def _domain(host: str) -> str:
    labels = host.split(".")
    count = 3 if ".".join(labels[-2:]) in _TWO_PART_SUFFIXES else 2
    return ".".join(labels[-count:])


def _scripts(label: str) -> frozenset[str]:
    scripts = set()
    for char in label:
        if char.isalpha():
            name = unicodedata.name(char, "UNKNOWN")
            scripts.add("CJK" if name.startswith("CJK") else name.split()[0])
    return frozenset(scripts)


def _skeleton(host: str) -> str:
    text = host.translate(_CONFUSABLE)
    for pair, letter in _CONFUSABLE_PAIRS:
        text = text.replace(pair, letter)
    return text
