// The files kvq demo and kvq bench decode use when none is given: SmolLM2-135M (scripts/fetch-models.sh), else
// stories260K from the shared data folder beside the repository, and a text to read.
#pragma once

#include <string>

namespace kvq::cli {

/// A checkpoint and its tokenizer file ("" for a GGUF, which holds its tokenizer).
struct ModelFiles {
  std::string model, tokenizer;
};

/// The default checkpoint, saying on stderr (as `command`) when it falls back to stories260K; kvq::Error when
/// neither is found.
ModelFiles default_model(const char* command);

/// A text to run through a model, and where it came from.
struct TextFile {
  std::string name, text;
};

/// The file at `path` when given, else the TinyStories validation text when present, else a built-in paragraph.
TextFile default_text(const std::string& path);

/// The path of the default model, for help texts.
extern const char* const kDefaultModelHelp;

}  // namespace kvq::cli
