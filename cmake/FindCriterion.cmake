# Criterion (Debian libcriterion-dev) as the imported target Criterion::Criterion.
find_path(CRITERION_INCLUDE_DIR criterion/criterion.h)
find_library(CRITERION_LIBRARY criterion)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Criterion DEFAULT_MSG CRITERION_LIBRARY CRITERION_INCLUDE_DIR)
if(Criterion_FOUND AND NOT TARGET Criterion::Criterion)
  add_library(Criterion::Criterion UNKNOWN IMPORTED)
  set_target_properties(Criterion::Criterion PROPERTIES
    IMPORTED_LOCATION "${CRITERION_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CRITERION_INCLUDE_DIR}")
endif()
