"""An application that imports a package only its runtime_env's pip field provides
(``inflection``), for the pip/uv tests."""

import inflection

from kubeserve import deployment


@deployment
def camel(request: object) -> dict[str, str]:
    return {"camel": inflection.camelize("hello_world"), "file": inflection.__file__}


app = camel.bind()
