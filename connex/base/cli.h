// Flag parsing shared by every binary: a narrow facade over CLI11 (connex::cli::App, Option,
// Validator), the --log-level flag, size flags with limits, and the exit codes of a parse (0
// after --help, 2 for a usage error, in every binary alike).
//
// Why a facade: CLI11 is header-only, and its header costs a translation unit about 6 CPU seconds
// (3 to parse, 3 to compile the inline functions a program uses) — in every program's main, every
// benchmark and every test that defines flags. Behind this header, CLI11 is compiled once
// (cli.cc). The facade keeps CLI11's names (add_option, check, envname, capture_default_str, ...)
// and forwards each call unchanged, so CLI11's documentation describes what each one does and the
// programs' --help and error messages are CLI11's own.
//
// Thread-compatible: binaries call these from main before starting threads.
#ifndef CONNEX_BASE_CLI_H_
#define CONNEX_BASE_CLI_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace CLI {
class App;
class Option;
class Validator;
}  // namespace CLI

namespace connex {

// The exit code of a usage error (a bad flag or value) in every binary.
inline constexpr int kUsageExitCode = 2;

namespace cli {

// A check (or transformation) of one value, as CLI::Validator: the function returns an empty
// string for a good value, else the message. Copyable.
class Validator {
 public:
  // `check` may rewrite the value (a transformer); `description` is shown in --help.
  Validator(std::function<std::string(std::string&)> check, std::string description);
  ~Validator();
  Validator(const Validator&);
  Validator& operator=(const Validator&);

  const CLI::Validator& impl() const { return *impl_; }
  explicit Validator(std::shared_ptr<const CLI::Validator> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const CLI::Validator> impl_;
};

// CLI::Range: the value parses as a number of T's kind (signed, unsigned, floating) and lies in
// [min, max]; --help shows "INT in [min - max]" (UINT, FLOAT) as CLI11 does.
Validator RangeOfInts(int64_t min, int64_t max);
Validator RangeOfUints(uint64_t min, uint64_t max);
Validator RangeOfFloats(double min, double max);
template <class T>
Validator Range(T min, T max) {
  if constexpr (std::is_floating_point_v<T>) {
    return RangeOfFloats(static_cast<double>(min), static_cast<double>(max));
  } else if constexpr (std::is_signed_v<T>) {
    return RangeOfInts(static_cast<int64_t>(min), static_cast<int64_t>(max));
  } else {
    return RangeOfUints(static_cast<uint64_t>(min), static_cast<uint64_t>(max));
  }
}
// CLI::IsMember: one of `names` (with `ignore_case`, in any case; the value becomes the name's
// spelling).
Validator IsMember(std::vector<std::string> names, bool ignore_case = false);
// CLI::CheckedTransformer over a map of words to booleans: "on" -> "1" and so on; anything else
// is an error naming the words.
Validator CheckedTransformer(std::map<std::string, bool> words);
// CLI::PositiveNumber, CLI::NonNegativeNumber, CLI::ExistingFile.
extern const Validator PositiveNumber;
extern const Validator NonNegativeNumber;
extern const Validator ExistingFile;

class App;

// One flag or option of an App (CLI::Option); the App owns it. Each setter returns this, to chain.
class Option {
 public:
  explicit Option(CLI::Option* impl) : impl_(impl) {}
  Option(const Option&) = delete;
  Option& operator=(const Option&) = delete;

  Option* envname(std::string name);
  Option* check(const Validator& validator);
  // `check` returns an empty string for a good value, else the message.
  Option* check(std::function<std::string(const std::string&)> check, std::string description = "");
  Option* transform(const Validator& validator);
  Option* capture_default_str();
  Option* default_str(std::string text);
  Option* required(bool value = true);
  Option* excludes(Option* other);
  Option* needs(Option* other);
  Option* group(std::string name);  // "": hidden from --help
  Option* delimiter(char separator);
  CLI::Option& impl() { return *impl_; }
  // After the parse: how many times it was given (0: not given; an envname counts once).
  size_t count() const;
  std::string get_name() const;
  int get_expected_min() const;
  // The value given, converted as CLI11 converts it (defined for std::string).
  template <class T>
  T as() const;

 private:
  friend class App;
  CLI::Option* impl_;
};

// A program's flags, or a sub-command's (CLI::App). A sub-command is owned by its parent.
class App {
 public:
  explicit App(std::string description = "", std::string name = "");
  ~App();
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  // An option bound to `variable` (its type decides how the value parses, as in CLI11). Defined
  // for the integer types, float, double, std::string and vectors of those (cli.cc).
  template <class T>
  requires(!std::is_const_v<T> &&
           !std::is_array_v<T>) Option* add_option(std::string name, T& variable,
                                                   std::string description = "");
  // An option whose values are only checked (a hidden trap, for instance) or counted. (A
  // `const char*`: a std::string lvalue after the name is a variable to bind, as in CLI11.)
  Option* add_option(std::string name, const char* description = "");
  // `callback` gets the value once parsed.
  Option* add_option_function(std::string name, std::function<void(const std::string&)> callback,
                              std::string description = "");
  Option* add_flag(std::string name, bool& variable, std::string description = "");
  Option* add_flag(std::string name, const char* description = "");  // counted (count())
  Option* add_flag_callback(std::string name, std::function<void()> callback,
                            std::string description = "");

  App* add_subcommand(std::string name, std::string description = "");
  App* require_subcommand(int count);
  App* fallthrough(bool value = true);
  App* alias(std::string name);
  // After the parse: this (sub-)command was given.
  bool parsed() const;
  std::vector<App*> get_subcommands() const;
  std::string get_name() const;
  bool check_name(const std::string& word) const;
  // The option named `name` ("--flag"), nullptr if none.
  Option* get_option_no_throw(const std::string& name);

  CLI::App& impl() { return *impl_; }

 private:
  explicit App(CLI::App* impl);  // a sub-command
  Option* Wrap(CLI::Option* option);

  std::unique_ptr<CLI::App> owned_;  // a top-level App's
  CLI::App* impl_;
  std::deque<Option> options_;
  std::deque<std::unique_ptr<App>> subcommands_;
};

// Thrown by a ParseFlags `also` check across flags: reported as CLI11 reports a validation
// failure ("NAME: MESSAGE"), exit kUsageExitCode.
class ValidationError : public std::runtime_error {
 public:
  ValidationError(std::string name, const std::string& message)
      : std::runtime_error(message), name_(std::move(name)) {}
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};
// Thrown by a ParseFlags `also` check: a flag that must be given is not ("NAME is required").
class RequiredError : public std::runtime_error {
 public:
  explicit RequiredError(const std::string& name) : std::runtime_error(name) {}
};

}  // namespace cli

// Adds --log-level (variable CONNEX_LOG_LEVEL) to `app`: one of kLogLevelNames, anything else is
// a usage error naming the accepted names. The level applies while `app` is parsed;
// `default_level` when neither the flag nor the variable is given.
cli::Option* AddLogLevelFlag(cli::App& app, std::string_view default_level = "info");

// Adds --insecure (variable CONNEX_INSECURE): lets the listeners of this process use a
// non-loopback address without authentication (connex/base/curve.h, CheckListenExposure). The flag
// sets CONNEX_INSECURE=1 for the process.
cli::Option* AddInsecureFlag(cli::App& app);

// Adds a hidden flag `name` that is always a usage error: a secret is never taken from argv
// (`ps` shows every process's argv to every user). The message names `use_instead`, e.g.
// "--token-file FILE or CONNEX_DIRECTORY_TOKEN".
cli::Option* AddRefusedSecretFlag(cli::App& app, const std::string& name,
                                  const std::string& use_instead);

// A validator for a size flag (`4096`, `4K`, `64KiB`, `1M`, `1G`: ParseSize) that must lie in
// [min, max] bytes; with `list`, every item of a comma-separated list must. The message names the
// value and the limit (CLI11 prefixes the flag).
cli::Validator SizeRange(uint64_t min, uint64_t max, bool list = false);

// "PROGRAM VERSION": the basename of `program` (argv[0]) and the project's version (CMake's
// PROJECT_VERSION), as every binary's --version prints it.
std::string VersionText(std::string_view program);

// Parses `argv` into `app` (adding --version unless `app` has a version flag already); `also`
// (optional) runs right after, for checks across flags that throw cli::ValidationError or
// cli::RequiredError. Returns nullopt to go on, otherwise the exit code with CLI11's message
// printed: 0 after --help, kUsageExitCode for any parse or validation error. (CLI11's own
// `app.exit(e)` returns 105..114 for errors, which scripts cannot tell from a crash.)
std::optional<int> ParseFlags(cli::App& app, int argc, char** argv,
                              const std::function<void()>& also = {});

}  // namespace connex

#endif  // CONNEX_BASE_CLI_H_
