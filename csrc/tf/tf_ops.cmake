# tf_ops.cmake — the TensorFlow op library dualemb/tf/_ops.so (included by the top-level
# CMakeLists.txt when DUALEMB_BUILD_TF=ON).
#
# It is compiled with TensorFlow's own flags (C++ ABI, Eigen alignment) and links the shared core
# dynamically, so its tables are the ones every other front end sees. A TF op library only runs
# with the exact TensorFlow it was compiled against: the version is written to
# dualemb/tf/_ops_tf_version.txt (checked by dualemb/tf/_load.py before loading) and compiled in
# (op DualembBuildInfo).
if(NOT Python_EXECUTABLE)
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter)
endif()

# One query per value, each printed on stdout alone (TF's own log lines go to stderr).
function(dualemb_tf_query out expr)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
      "import os; os.environ['TF_CPP_MIN_LOG_LEVEL']='3'; import tensorflow as tf; print(${expr})"
    OUTPUT_VARIABLE value ERROR_VARIABLE err RESULT_VARIABLE rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    set(${out} "" PARENT_SCOPE)
    set(DUALEMB_TF_ERR "${err}" PARENT_SCOPE)
  else()
    set(${out} "${value}" PARENT_SCOPE)
  endif()
endfunction()

dualemb_tf_query(DUALEMB_TF_VERSION "tf.__version__")
dualemb_tf_query(DUALEMB_TF_CFLAGS "';'.join(tf.sysconfig.get_compile_flags())")
dualemb_tf_query(DUALEMB_TF_LFLAGS "';'.join(tf.sysconfig.get_link_flags())")

file(GLOB DUALEMB_TF_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/csrc/tf/*.cc)

# The TensorFlow release the op library supports (its kernels, shape functions and Keras 3 glue
# are written and tested against it; a TF op library is tied to one release's headers and ABI).
set(DUALEMB_TF_SUPPORTED "2.21")

if(NOT DUALEMB_TF_VERSION)
  message(WARNING "tensorflow is not importable by ${Python_EXECUTABLE}: dualemb/tf/_ops.so is "
                  "not built (${DUALEMB_TF_ERR})")
elseif(NOT DUALEMB_TF_VERSION MATCHES "^2\\.21\\.")
  message(FATAL_ERROR "dualemb's TensorFlow op library supports TensorFlow "
                      "${DUALEMB_TF_SUPPORTED}.x only; ${Python_EXECUTABLE} has TensorFlow "
                      "${DUALEMB_TF_VERSION}. Install tensorflow-cpu==${DUALEMB_TF_SUPPORTED}.* "
                      "(pip install -r requirements-build.txt), or build without the TF ops: "
                      "-DDUALEMB_BUILD_TF=OFF (pip: -Ccmake.define.DUALEMB_BUILD_TF=OFF)")
elseif(NOT DUALEMB_TF_SOURCES)
  message(WARNING "no sources in csrc/tf: dualemb/tf/_ops.so is not built")
else()
  message(STATUS "dualemb: building the TF op library against TensorFlow ${DUALEMB_TF_VERSION}")

  add_library(_ops SHARED ${DUALEMB_TF_SOURCES})
  target_include_directories(_ops PRIVATE ${CMAKE_SOURCE_DIR}/csrc/core ${CMAKE_SOURCE_DIR}/csrc/tf)
  # TF's flags (-I..., -D_GLIBCXX_USE_CXX11_ABI=1, --std=c++17, -DEIGEN_MAX_ALIGN_BYTES=64).
  target_compile_definitions(_ops PRIVATE DUALEMB_TF_VERSION="${DUALEMB_TF_VERSION}")
  target_compile_options(_ops PRIVATE ${DUALEMB_TF_CFLAGS} -O2 -Wno-sign-compare -Wno-interference-size
                         -Wno-deprecated-declarations -Wno-unused-parameter -Wno-attributes)
  target_link_libraries(_ops PRIVATE ${DUALEMB_TF_LFLAGS})  # -L<tf> -l:libtensorflow_framework.so.2
  dualemb_link_core(_ops)
  set_target_properties(_ops PROPERTIES
    PREFIX ""
    OUTPUT_NAME _ops
    LIBRARY_OUTPUT_DIRECTORY ${DUALEMB_OUT}/tf)
  install(TARGETS _ops LIBRARY DESTINATION dualemb/tf)

  set(DUALEMB_TF_VERSION_FILE ${DUALEMB_OUT}/tf/_ops_tf_version.txt)
  file(WRITE ${DUALEMB_TF_VERSION_FILE} "${DUALEMB_TF_VERSION}\n")
  install(FILES ${DUALEMB_TF_VERSION_FILE} DESTINATION dualemb/tf)
endif()
