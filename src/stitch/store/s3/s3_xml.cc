#include "stitch/store/s3/s3_xml.h"

#include <expat.h>

#include <limits>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace {

constexpr int kMaxDepth = 64;

struct ParseState {
  XML_Parser parser = nullptr;
  XmlElement root;
  // The chain of open elements; each points into its parent's children,
  // which only grow at the back while the pointer is the last one in use.
  std::vector<XmlElement*> open;
  bool has_root = false;
  std::string error;
};

void Stop(ParseState* st, std::string why) {
  if (st->error.empty()) st->error = std::move(why);
  XML_StopParser(st->parser, XML_FALSE);
}

void OnStart(void* data, const XML_Char* name, const XML_Char** /*attrs*/) {
  auto* st = static_cast<ParseState*>(data);
  if (static_cast<int>(st->open.size()) >= kMaxDepth) return Stop(st, "nested too deeply");
  XmlElement* element;
  if (st->open.empty()) {
    if (st->has_root) return Stop(st, "more than one root element");
    st->has_root = true;
    element = &st->root;
  } else {
    element = &st->open.back()->children.emplace_back();
  }
  element->name = name;
  st->open.push_back(element);
}

void OnEnd(void* data, const XML_Char* /*name*/) {
  auto* st = static_cast<ParseState*>(data);
  if (st->open.empty()) return;
  XmlElement* element = st->open.back();
  element->text = std::string(absl::StripAsciiWhitespace(element->text));
  st->open.pop_back();
}

void OnText(void* data, const XML_Char* s, int len) {
  auto* st = static_cast<ParseState*>(data);
  if (!st->open.empty()) st->open.back()->text.append(s, static_cast<size_t>(len));
}

// S3 never sends a DOCTYPE; refusing it rules out entity tricks entirely.
void OnDoctype(void* data, const XML_Char*, const XML_Char*, const XML_Char*, int) {
  Stop(static_cast<ParseState*>(data), "a DOCTYPE is not accepted");
}

absl::Status Malformed(absl::string_view what, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed ", what, " XML from the service: ", why));
}

std::string XmlEscape(std::string_view s) {
  return absl::StrReplaceAll(
      AbslView(s),
      {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&apos;"}});
}

}  // namespace

const XmlElement* XmlElement::Child(std::string_view child) const {
  for (const XmlElement& c : children) {
    if (c.name == child) return &c;
  }
  return nullptr;
}

std::string XmlElement::ChildText(std::string_view child) const {
  const XmlElement* c = Child(child);
  return c == nullptr ? std::string() : c->text;
}

absl::StatusOr<XmlElement> ParseXml(std::string_view xml) {
  if (xml.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError("XML document too large");
  }
  std::unique_ptr<XML_ParserStruct, decltype(&XML_ParserFree)> parser(XML_ParserCreate("UTF-8"),
                                                                      &XML_ParserFree);
  if (!parser) return absl::ResourceExhaustedError("cannot create an XML parser");
  ParseState st;
  st.parser = parser.get();
  XML_SetUserData(parser.get(), &st);
  XML_SetElementHandler(parser.get(), &OnStart, &OnEnd);
  XML_SetCharacterDataHandler(parser.get(), &OnText);
  XML_SetStartDoctypeDeclHandler(parser.get(), &OnDoctype);
  XML_Status status = XML_Parse(parser.get(), xml.data(), static_cast<int>(xml.size()), XML_TRUE);
  if (!st.error.empty()) return absl::InvalidArgumentError(st.error);
  if (status != XML_STATUS_OK) {
    return absl::InvalidArgumentError(absl::StrCat(XML_ErrorString(XML_GetErrorCode(parser.get())),
                                                   " at line ",
                                                   XML_GetCurrentLineNumber(parser.get())));
  }
  if (!st.has_root) return absl::InvalidArgumentError("no root element");
  return std::move(st.root);
}

absl::StatusOr<S3ErrorDocument> ParseS3Error(std::string_view xml) {
  auto doc = ParseXml(xml);
  if (!doc.ok()) return Malformed("error", doc.status().message());
  if (doc->name != "Error") return Malformed("error", absl::StrCat("root is <", doc->name, ">"));
  return S3ErrorDocument{doc->ChildText("Code"), doc->ChildText("Message")};
}

absl::StatusOr<S3ListPage> ParseListObjectsV2(std::string_view xml) {
  auto doc = ParseXml(xml);
  if (!doc.ok()) return Malformed("ListObjectsV2", doc.status().message());
  if (doc->name != "ListBucketResult") {
    return Malformed("ListObjectsV2", absl::StrCat("root is <", doc->name, ">"));
  }
  S3ListPage page;
  for (const XmlElement& c : doc->children) {
    if (c.name != "Contents") continue;
    S3ObjectSummary object;
    object.key = c.ChildText("Key");
    if (object.key.empty()) return Malformed("ListObjectsV2", "an entry has no <Key>");
    if (!absl::SimpleAtoi(c.ChildText("Size"), &object.size)) {
      return Malformed("ListObjectsV2",
                       absl::StrCat("entry \"", object.key, "\" has a bad <Size>"));
    }
    page.objects.push_back(std::move(object));
  }
  std::string truncated = absl::AsciiStrToLower(doc->ChildText("IsTruncated"));
  page.truncated = truncated == "true";
  if (page.truncated) {
    page.next_continuation_token = doc->ChildText("NextContinuationToken");
    if (page.next_continuation_token.empty()) {
      return Malformed("ListObjectsV2", "a truncated page has no <NextContinuationToken>");
    }
  }
  return page;
}

absl::StatusOr<std::string> ParseInitiateMultipartUpload(std::string_view xml) {
  auto doc = ParseXml(xml);
  if (!doc.ok()) return Malformed("InitiateMultipartUpload", doc.status().message());
  if (doc->name != "InitiateMultipartUploadResult") {
    return Malformed("InitiateMultipartUpload", absl::StrCat("root is <", doc->name, ">"));
  }
  std::string id = doc->ChildText("UploadId");
  if (id.empty()) return Malformed("InitiateMultipartUpload", "no <UploadId>");
  return id;
}

std::string CompleteMultipartUploadXml(const std::vector<std::string>& part_etags) {
  std::string out = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < part_etags.size(); ++i) {
    absl::StrAppend(&out, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>",
                    XmlEscape(part_etags[i]), "</ETag></Part>");
  }
  absl::StrAppend(&out, "</CompleteMultipartUpload>");
  return out;
}

}  // namespace stitch
